"""Relaying into RabbitMQ quorum queues with publisher confirms (single-node quorum queues on the shared broker).

A quorum queue confirms a message once its raft log committed it; with
``x-overflow = reject-publish`` a full queue nacks, which the transport
reports RetryLater, and the relay retries in order.
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path

import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.contract.transport import Received
from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
from tests.peers._relay import assert_complete_and_ordered
from tests.peers.rabbitmq import ExchangeFactory

QUORUM = {"x-queue-type": "quorum"}


def _config(tmp_path: Path, url: str, exchange: str, pipeline: bool) -> dict[str, object]:
    return {
        "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
        "relay": {"poll_interval": 0.05},
        "destinations": {
            "r": {
                "transport": "rabbitmq",
                "url": url,
                "exchange": exchange,
                "routing_key": "q.{stream}",
                "pipeline": pipeline,
                "retry": {"initial_delay": 0.02, "max_delay": 0.2, "max_attempts": 10_000},
            }
        },
    }


async def test_relay_into_a_quorum_queue(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
) -> None:
    """5,000 events over 50 streams, pipelined, confirmed by a quorum queue: all there once, in order per stream."""
    exchange = await rabbitmq_exchanges("qq")
    queue = await rabbitmq_exchanges.queue(exchange, "q.*", QUORUM)
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.qq", stream=f"s{i % 50}", data={"i": i}) for i in range(5_000)]
    outbox.append(events)
    summary = await Relay(outbox, parse_config(_config(tmp_path, rabbitmq_url, exchange, True))).run(drain=True)
    outbox.close()
    assert summary.remaining == 0 and summary.counts["r"]["delivered"] == 5_000
    reader = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url)).reader(f"{exchange}/q.*", queue=queue)
    async with reader:
        got = await reader.read(5_000, 20)
        got += await reader.read(10, 0.3)
    assert_complete_and_ordered(events, got)


@pytest.mark.parametrize("pipeline", [False, True], ids=["one-in-flight", "pipelined"])
async def test_reject_publish_overflow(
    tmp_path: Path,
    rabbitmq_url: str,
    rabbitmq_exchanges: ExchangeFactory,
    pipeline: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A quorum queue of 50 messages at most with x-overflow = reject-publish, read only once it
    overflowed, while 2,000 events over 20 streams are relayed: the broker nacks (RetryLater, retried), nothing is lost.
    One in flight per stream keeps every stream's order exact; pipelined, a stream can break order
    only where the relay logged it (RabbitMQ has no server-side guard)."""
    exchange = await rabbitmq_exchanges("qqfull")
    args = {**QUORUM, "x-max-length": 50, "x-overflow": "reject-publish"}
    queue = await rabbitmq_exchanges.queue(exchange, "q.*", args)
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.qq", stream=f"s{i % 20}", data={"i": i}) for i in range(2_000)]
    outbox.append(events)
    relay = Relay(outbox, parse_config(_config(tmp_path, rabbitmq_url, exchange, pipeline)))
    reader = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url)).reader(f"{exchange}/q.*", queue=queue)
    got: list[Received] = []
    caplog.set_level(logging.WARNING, logger="outrelay.transports.rabbitmq")
    task = asyncio.create_task(relay.run(drain=True))
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 10
    while (w := relay.workers.get("r")) is None or w.counts["retried"] < 20:  # full: the broker nacks
        assert loop.time() < deadline and not task.done(), "the queue never overflowed"
        await asyncio.sleep(0.01)
    async with reader:
        while not task.done() or len({g.event.id for g in got}) < len(events):
            batch = await reader.read(500, 0.2)
            got += batch
            if not batch and task.done():
                break
        summary = await task
        got += await reader.read(10, 0.3)
    outbox.close()
    assert summary.remaining == 0 and summary.counts["r"]["delivered"] == len(events)
    assert summary.counts["r"]["retried"] > 0, "the queue never overflowed: nothing was nacked"
    if not pipeline:
        assert_complete_and_ordered(events, got, exactly_once=False)
        return
    assert {g.event.id for g in got} == {e.id for e in events}
    warned = {m for r in caplog.records for m in re.findall(r"stream '([^']+)' may be out of order", r.getMessage())}
    first: dict[str, list[str]] = {}
    for g in got:
        lane = first.setdefault(g.event.stream, [])
        if g.event.id not in lane:
            lane.append(g.event.id)
    broken = {s for s, ids in first.items() if ids != [e.id for e in events if e.stream == s]}
    assert broken <= warned, f"order broken without a warning on {sorted(broken - warned)}"
    print(f"pipelined reject-publish: {summary.counts['r']['retried']} retries, {len(broken)} streams out of order")
