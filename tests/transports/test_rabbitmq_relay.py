"""End to end: SQLite outbox -> Relay -> RabbitMQ -> reader."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from urllib.parse import urlsplit

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
from tests.peers._relay import drain_with_cuts
from tests.peers.proxy import TcpProxy
from tests.peers.rabbitmq import ExchangeFactory


async def test_relay_10k_events_50_streams(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
) -> None:
    """10,000 events over 50 streams relayed from SQLite all arrive on a queue, in exact order per stream."""
    exchange = await rabbitmq_exchanges("e2e")
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.e2e", stream=f"s{i % 50}", data={"i": i}) for i in range(10_000)]
    outbox.append(events)
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "destinations": {
                "r": {
                    "transport": "rabbitmq",
                    "url": rabbitmq_url,
                    "exchange": exchange,
                    "routing_key": "s.{stream}",
                    "retry": {"initial_delay": 0.05},
                }
            },
        }
    )
    reader_t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=exchange))
    async with reader_t.reader(f"{exchange}/s.*") as reader:
        started = time.monotonic()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.monotonic() - started
        got = await reader.read(10_000, 20)
        got += await reader.read(10, 0.3)
    outbox.close()
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert summary.counts["r"]["delivered"] == 10_000
    assert len(got) == 10_000 and {g.event.id for g in got} == {e.id for e in events}
    want: dict[str, list[str]] = defaultdict(list)
    seen: dict[str, list[str]] = defaultdict(list)
    for e in events:
        want[e.stream].append(e.id)
    for g in got:
        seen[g.event.stream].append(g.event.id)
    assert seen == want
    assert elapsed < 60


async def test_pipelined_order_survives_connection_cuts(
    tmp_path: Path, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
) -> None:
    """With pipelining on, the network dropping the connection three times mid-run loses nothing and
    never lets a later event of a stream arrive before an earlier one: a cut loses a tail of what was
    on the wire, never a hole, so the first arrival of every event is in append order (re-sends of
    unconfirmed messages may repeat a tail: RabbitMQ has no dedupe)."""
    exchange = await rabbitmq_exchanges("cuts")
    parts = urlsplit(rabbitmq_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    await proxy.start()
    url = rabbitmq_url.replace(f"{parts.hostname}:{parts.port or 5672}", f"127.0.0.1:{proxy.port}")
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.cut", stream=f"s{i % 10}", data={"i": i}) for i in range(4_000)]
    outbox.append(events)
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "r": {
                    "transport": "rabbitmq",
                    "url": url,
                    "exchange": exchange,
                    "routing_key": "s.{stream}",
                    "confirm_timeout": 2,
                    "connect_timeout": 2,
                    "batch_size": 200,
                    "per_stream": 50,
                    "retry": {"initial_delay": 0.05, "max_delay": 0.2, "max_attempts": 1000},
                }
            },
        }
    )
    reader_t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=exchange))
    try:
        async with reader_t.reader(f"{exchange}/s.*") as reader:
            summary, cuts = await drain_with_cuts(Relay(outbox, cfg), "r", proxy.cut, every=800)
            got = await reader.read(len(events), 20)
            got += await reader.read(len(events), 0.5)  # re-sent tails, if any
    finally:
        outbox.close()
        await proxy.stop()
    assert cuts == 3, "the relay finished before the connection could be cut three times"
    assert summary.remaining == 0 and summary.dead_lettered == 0
    want: dict[str, list[str]] = defaultdict(list)
    first: dict[str, list[str]] = defaultdict(list)
    for e in events:
        want[e.stream].append(e.id)
    arrived: set[str] = set()
    for g in got:
        if g.event.id not in arrived:
            arrived.add(g.event.id)
            first[g.event.stream].append(g.event.id)
    assert first == want
