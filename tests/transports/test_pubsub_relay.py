"""End to end: SQLite outbox -> Relay -> Pub/Sub emulator -> pull subscription, with throttling."""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from outrelay import Event, Outbox, Received, Relay, parse_config
from outrelay.transports.pubsub._config import PubSubConfig
from outrelay.transports.pubsub._transport import PubSubTransport
from tests.peers._relay import assert_complete_and_ordered
from tests.peers.pubsub_emulator import PROJECT, ThrottlingProxy, create_topic


def _config(tmp_path: Path, host: str, topic: str, **extra: Any) -> Any:
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "destinations": {
                "ps": {
                    "transport": "pubsub",
                    "project": PROJECT,
                    "topic": topic,
                    "emulator_host": host,
                    "batch_size": 1000,
                    "per_stream": 50,
                    "max_in_flight": 8,
                    "retry": {"initial_delay": 0.05, "max_delay": 0.5, "max_attempts": 100},
                    **extra,
                }
            },
        }
    )


async def _relay_and_read(
    tmp_path: Path, emulator: str, relay_host: str, n: int
) -> tuple[list[Event], Any, list[Received]]:
    topic = f"e2e-{uuid.uuid4().hex[:8]}"
    create_topic(emulator, topic)
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.e2e", stream=f"s{i % 50}", data={"i": i}) for i in range(n)]
    outbox.append(events)
    reader_t = PubSubTransport(PubSubConfig(project=PROJECT, topic=topic, emulator_host=emulator))
    async with reader_t.reader(topic) as reader:
        summary = await Relay(outbox, _config(tmp_path, relay_host, topic)).run(drain=True)
        got = await reader.read(n, 30)
        got += await reader.read(n, 0.5)
    outbox.close()
    return events, summary, got


async def test_relay_5000_events_50_streams(tmp_path: Path, pubsub_emulator: str) -> None:
    """5,000 events over 50 streams relayed from SQLite all arrive, in exact order per ordering key."""
    started = time.monotonic()
    events, summary, got = await _relay_and_read(tmp_path, pubsub_emulator, pubsub_emulator, 5000)
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert summary.counts["ps"]["delivered"] == 5000
    assert_complete_and_ordered(events, got, exactly_once=False, adjacent_redelivery=True)
    assert time.monotonic() - started < 40


async def test_relay_backs_off_under_throttling(tmp_path: Path, pubsub_emulator: str) -> None:
    """With every 5th Publish answered RESOURCE_EXHAUSTED the relay retries and delivers everything in order."""
    proxy = ThrottlingProxy(pubsub_emulator).start()
    proxy.throttle(every=5, count=40)
    try:
        events, summary, got = await _relay_and_read(tmp_path, pubsub_emulator, proxy.host, 2000)
    finally:
        proxy.stop()
    assert proxy.throttled > 0
    assert summary.counts["ps"]["retried"] > 0
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert_complete_and_ordered(events, got, exactly_once=False, adjacent_redelivery=True)
