"""The relay's retention loop prunes delivered history in small batches while delivering."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from pathlib import Path

import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.memory import MemoryTransport


async def test_relay_keeps_the_last_n_per_stream_and_delivers_everything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With retention_per_stream=5 the relay delivers all events in order and keeps only each stream's last 5."""
    monkeypatch.setattr(Relay, "retention_interval", 0.05)
    monkeypatch.setattr(Relay, "retention_batch", 7)  # many small transactions between deliveries
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db", "retention_per_stream": 5},
            "relay": {"poll_interval": 0.05},
            "destinations": {"mem": {"transport": "memory", "broker": "ret", "latency": 0.001, "batch_size": 10}},
        }
    )
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append([Event(type="t", stream=f"s{i % 3}", data={"i": i}) for i in range(300)])
    relay = Relay(outbox, cfg)
    task = asyncio.create_task(relay.run())
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and len(outbox.store.events(limit=1000)) > 15:
        await asyncio.sleep(0.05)
    relay.stop()
    await task
    seen: dict[str, list[int]] = defaultdict(list)
    for m in MemoryTransport.broker("ret").all():
        seen[m.event.stream].append(m.event.json()["i"])
    assert {k: v for k, v in seen.items()} == {f"s{r}": list(range(r, 300, 3)) for r in range(3)}
    left = sorted(e.json()["i"] for e in outbox.store.events(limit=1000))
    assert left == sorted(i for r in range(3) for i in list(range(r, 300, 3))[-5:])
