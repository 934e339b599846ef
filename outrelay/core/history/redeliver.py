"""Replaying history to a destination: select, check, then queue at a rate.

``outrelay replay`` uses these. :func:`plan` reads the selected history once
(upcasting every event, so an event type with no upcaster path fails here,
before anything is queued) and counts it per type; :func:`requeue` then
queues it page by page (one transaction per page, in sequence order, so each
stream's order holds) at most ``rate`` events per second. A running relay
delivers what was queued. Only routed events are queued: history the relay
has not fanned out yet is delivered by it anyway.

:raises NotFoundError: nothing in the history matches (nothing is queued).
:raises EventError: an event has no upcaster path (nothing is queued).
:raises StoreError: the database failed.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

from outrelay.core.history.history import scan_where
from outrelay.core.history.upcasting import Upcasters
from outrelay.core.model.errors import NotFoundError, UsageError
from outrelay.core.stores.base import HistoryFilter

if TYPE_CHECKING:
    from outrelay.core.stores.base import Store

__all__ = ["ReplayPlan", "describe", "plan", "requeue"]


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayPlan:
    """What a replay would send: the count, per type, and the sequence range."""

    count: int
    by_type: dict[str, int]
    first: int
    last: int


def describe(where: HistoryFilter, after: int) -> str:
    """The selection in words, for messages (``stream 'o-1', types order.*``)."""
    parts = [f"stream {where.stream!r}" if where.stream else "all streams"]
    if where.types:
        parts.append("types " + ",".join(where.types))
    if where.tenant:
        parts.append(f"tenant {where.tenant!r}")
    if where.since is not None or where.until is not None:
        parts.append(f"time [{_iso(where.since)}, {_iso(where.until)})")
    if after:
        parts.append(f"after sequence {after}")
    return ", ".join(parts)


def _iso(ts: float | None) -> str:
    if ts is None:
        return "…"
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


def plan(store: Store, where: HistoryFilter, *, after: int = 0, upcasters: Upcasters | None = None) -> ReplayPlan:
    """Count the selected history (reading and upcasting all of it).

    :raises UsageError: an empty time range. :raises NotFoundError: nothing selected."""
    if where.since is not None and where.until is not None and where.since >= where.until:
        raise UsageError(f"the time range [{_iso(where.since)}, {_iso(where.until)}) is empty; --since must be earlier")
    by_type: Counter[str] = Counter()
    first = last = 0
    for event in scan_where(store, where, after=after, upcasters=upcasters):
        by_type[event.type] += 1
        last = event.sequence or last
        first = first or last
    if not by_type:
        raise NotFoundError(f"no events in the outbox match {describe(where, after)}; nothing to replay")
    return ReplayPlan(sum(by_type.values()), dict(sorted(by_type.items())), first, last)


def requeue(
    store: Store,
    destination: str,
    where: HistoryFilter,
    *,
    after: int = 0,
    rate: float | None = None,
    page: int = 1000,
    progress: Callable[[int], None] | None = None,
) -> int:
    """Queue the selected, routed history to ``destination`` in sequence
    order, at most ``rate`` events per second (None: as fast as the database
    takes it); ``progress(n)`` is called after each page with the count queued
    so far. Returns the count queued."""
    if rate is not None and rate <= 0:
        raise UsageError(f"the replay rate must be positive, got {rate}")
    size = page if rate is None else max(1, min(page, int(rate)))
    raw = Upcasters()  # destinations get events as stored; plan() has checked they upcast
    queued = 0
    started = time.monotonic()
    batch: list[int] = []

    def flush() -> None:
        nonlocal queued
        queued += store.replay_events(destination, batch, now=time.time())
        batch.clear()
        if progress:
            progress(queued)
        if rate is not None:  # pace: never ahead of rate * elapsed
            ahead = queued / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)

    for event in scan_where(store, where, after=after, upcasters=raw, page=size):
        batch.append(event.sequence or 0)
        if len(batch) >= size:
            flush()
    if batch:
        flush()
    return queued
