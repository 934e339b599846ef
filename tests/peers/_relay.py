"""End-to-end helper shared by the service tests: SQLite outbox → Relay → service → reader."""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from pathlib import Path
from typing import Any

from outrelay import Event, Outbox, Relay, RunSummary, parse_config
from outrelay.core.transport import Reader, Received

__all__ = ["RoundTrip", "relay_round_trip"]


@dataclasses.dataclass
class RoundTrip:
    """What was appended, what the reader got, and the relay's summary."""

    sent: list[Event]
    received: list[Received]
    summary: RunSummary

    def missing(self) -> set[str]:
        return {e.id for e in self.sent} - {r.event.id for r in self.received}

    def order_violations(self, *, first_seen: bool = False) -> list[str]:
        """Streams whose received ids differ from the appended order (``first_seen``: ignore redeliveries)."""
        want: dict[str, list[str]] = defaultdict(list)
        for e in self.sent:
            want[e.stream].append(e.id)
        got: dict[str, list[str]] = defaultdict(list)
        for r in self.received:
            ids = got[r.event.stream]
            if first_seen and r.event.id in ids:
                continue
            ids.append(r.event.id)
        return [s for s in want if got[s] != want[s]]


async def relay_round_trip(
    tmp_path: Path,
    destination: dict[str, Any],
    reader: Reader,
    *,
    events: int = 5000,
    streams: int = 50,
    read_timeout: float = 30.0,
) -> RoundTrip:
    """Append ``events`` over ``streams`` streams, drain them through a relay to
    ``destination`` while ``reader`` (already built for the target) reads."""
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    sent = [Event(type="order.created", stream=f"s{i % streams}", data={"i": i}) for i in range(events)]
    outbox.append(sent)
    cfg = parse_config({"outbox": {"url": outbox.url}, "destinations": {"d": destination}})
    async with reader:
        reading = asyncio.create_task(_read_all(reader, events, read_timeout))
        summary = await Relay(outbox, cfg).run(drain=True)
        received = await reading
    close = getattr(outbox.store, "close", None)
    if close is not None:
        close()
    return RoundTrip(sent, received, summary)


async def _read_all(reader: Reader, count: int, timeout: float) -> list[Received]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: list[Received] = []
    seen: set[str] = set()
    while len(seen) < count and loop.time() < deadline:
        got = await reader.read(min(500, count - len(seen)), min(2.0, deadline - loop.time()))
        out.extend(got)
        seen.update(r.event.id for r in got)
    return out
