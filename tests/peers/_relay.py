"""End-to-end helper shared by the service tests: SQLite outbox → Relay → service → reader."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from outrelay import Event, Outbox, Relay, RunSummary, parse_config
from outrelay.core.contract.transport import Reader, Received

__all__ = ["RoundTrip", "drain_with_cuts", "relay_round_trip"]


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


def assert_complete_and_ordered(
    events: list[Event],
    got: list[Received],
    *,
    exactly_once: bool = True,
    adjacent_redelivery: bool = False,
    key_is_stream: bool = False,
) -> None:
    """Every event arrived (exactly once, unless ``exactly_once`` is off) and each stream's
    events in append order; ``adjacent_redelivery`` tolerates a message read twice in a row,
    ``key_is_stream`` also requires the broker's key (partition key, SessionId) to be the stream."""
    ids = {g.event.id for g in got}
    assert len(ids) == len(events), f"{len(events) - len(ids)} events missing"
    if exactly_once:
        assert len(got) == len(events), f"{len(got) - len(events)} duplicates"
    want: dict[str, list[str]] = defaultdict(list)
    seen: dict[str, list[str]] = defaultdict(list)
    for e in events:
        want[e.stream].append(e.id)
    for g in got:
        if key_is_stream:
            assert g.key == g.event.stream, f"broker key {g.key!r} is not the stream {g.event.stream!r}"
        lane = seen[g.event.stream]
        if adjacent_redelivery and lane and lane[-1] == g.event.id:
            continue
        lane.append(g.event.id)
    for stream, order in want.items():
        assert seen[stream] == order, f"stream {stream} out of order"


async def drain_with_cuts(
    relay: Relay, destination: str, cut: Callable[[], None], *, every: int, cuts: int = 3
) -> tuple[RunSummary, int]:
    """Run ``relay`` to drain, calling ``cut()`` (a network fault) each time ``every`` more events
    of ``destination`` were delivered, ``cuts`` times at most; returns the summary and the cuts made."""
    task = asyncio.create_task(relay.run(drain=True))
    made = 0
    deadline = time.monotonic() + 60
    while not task.done() and made < cuts:
        assert time.monotonic() < deadline, "relay made no progress"
        worker = relay.workers.get(destination)
        if worker is not None and worker.counts["delivered"] > (made + 1) * every:
            cut()
            made += 1
        await asyncio.sleep(0.002)
    return await asyncio.wait_for(task, 90), made
