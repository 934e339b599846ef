"""End to end: SQLite outbox → Relay → Pulsar (pulsar-lite) → subscription."""

from __future__ import annotations

import uuid
from pathlib import Path

from outrelay.transports.pulsar._transport import PulsarConfig, PulsarTransport
from tests.peers._relay import relay_round_trip
from tests.peers.pulsar import pulsar_dedup


class TestPulsarRelay:
    async def test_5000_events_in_order_per_stream(self, pulsar_url: str, tmp_path: Path) -> None:
        """5,000 events over 50 streams all arrive, each stream in exact order (redeliveries aside)."""
        name = f"persistent://public/default/e2e-{uuid.uuid4().hex[:10]}"
        reader = PulsarTransport(PulsarConfig(service_url=pulsar_url, topic=name)).reader(name)
        destination = {
            "transport": "pulsar",
            "service_url": pulsar_url,
            "topic": name,
            "deduplication": pulsar_dedup(),
            "batch_size": 500,
            "retry": {"initial_delay": 0.05},
        }
        rt = await relay_round_trip(tmp_path, destination, reader, events=5000, streams=50)
        assert rt.summary.remaining == 0 and rt.summary.dead_lettered == 0
        assert rt.missing() == set()
        assert rt.order_violations(first_seen=True) == []
