"""End to end: SQLite outbox -> Relay -> RabbitMQ -> reader."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
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
