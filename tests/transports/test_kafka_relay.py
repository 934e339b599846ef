"""End to end: SQLite outbox -> Relay -> Kafka (tansu or OUTRELAY_KAFKA_BOOTSTRAP) -> consumer."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from outrelay import Event, Outbox, Received, Relay, parse_config
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from tests.peers.kafka import KafkaPeer, new_topic


def assert_complete_and_ordered(events: list[Event], got: list[Received]) -> None:
    """Every event arrived, none twice, and each stream's events in append order."""
    ids = {g.event.id for g in got}
    assert len(ids) == len(events), f"{len(events) - len(ids)} events missing"
    assert len(got) == len(events), f"{len(got) - len(events)} duplicates"
    want: dict[str, list[str]] = defaultdict(list)
    seen: dict[str, list[str]] = defaultdict(list)
    for e in events:
        want[e.stream].append(e.id)
    for g in got:
        seen[g.event.stream].append(g.event.id)
    for stream, order in want.items():
        assert seen[stream] == order, f"stream {stream} out of order"


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
