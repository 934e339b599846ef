"""End to end: SQLite outbox -> Relay -> Kafka (tansu or OUTRELAY_KAFKA_BOOTSTRAP) -> consumer."""

from __future__ import annotations

import time
from pathlib import Path

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from tests.peers._relay import assert_complete_and_ordered
from tests.peers.kafka import KafkaPeer, new_topic


async def test_relay_10k_events_50_streams(tmp_path: Path, kafka_peer: KafkaPeer) -> None:
    """10,000 events over 50 streams relayed from SQLite to Kafka all arrive, in exact order per stream."""
    topic = await new_topic(kafka_peer, prefix="e2e", partitions=4)
    url = f"sqlite:///{tmp_path}/o.db"
    outbox = Outbox.open(url)
    events = [Event(type="t.e2e", stream=f"s{i % 50}", data={"i": i}) for i in range(10_000)]
    outbox.append(events)
    options = kafka_peer.options(topic)
    cfg = parse_config(
        {
            "outbox": {"url": url},
            "destinations": {"k": {"transport": "kafka", **options, "retry": {"initial_delay": 0.05}}},
        }
    )
    reader_t = KafkaTransport(KafkaConfig.model_validate(options))
    async with reader_t.reader(topic) as reader:
        started = time.monotonic()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.monotonic() - started
        got = await reader.read(10_000, 20)
        got += await reader.read(10, 0.3)
    outbox.close()
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert summary.counts["k"]["delivered"] == 10_000
    assert_complete_and_ordered(events, got)
    assert {g.key for g in got} == {f"s{i}" for i in range(50)}
    assert elapsed < 60
