"""Reading the outbox's history: one stream in order, or a filtered scan.

Every reader pages through the log by sequence (keyset pagination: a page
costs the same with ten or ten million other rows, and memory stays at one
page however long the history is) and hands each event through the
upcasters (:mod:`outrelay.core.history.upcasting`), so callers see the current
version of every event type.

Guarantees: events come in sequence order, each once. On SQLite, sequence
order is commit order, so a reader following the log while events are
appended misses nothing. On PostgreSQL, an append committed *after* a
higher sequence was read (two concurrent writers) lands below the reader's
position; a reader resuming with ``after=`` can then miss it. Replaying
delivered history is not affected.

:raises EventError: an event with no upcaster path to its type's current version.
:raises StoreError: the database failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from outrelay.core.model.envelope import Event
from outrelay.core.model.history_filter import HistoryFilter, glob_to_like, matches

if TYPE_CHECKING:
    from outrelay.core.history.upcasting import Upcasters
    from outrelay.core.stores.base import Store

__all__ = [
    "HistoryFilter",
    "aread_stream",
    "ascan",
    "glob_to_like",
    "matches",
    "read_stream",
    "read_stream_pages",
    "scan",
    "scan_where",
    "timestamp",
]

#: events fetched per query: enough to amortise a PostgreSQL round trip, few enough that a page's rows
#: and events stay in the CPU cache between fetch, decode and the fold's apply (figures: benchmarks/README.md,
#: "Why the code is as it is")
PAGE = 500


def timestamp(value: float | datetime | None) -> float | None:
    """A time bound as Unix seconds (aware datetimes converted, naive refused)."""
    if value is None or isinstance(value, int | float):
        return value
    if value.tzinfo is None:
        from outrelay.core.model.errors import UsageError

        raise UsageError(f"time bound {value.isoformat()} has no timezone; give an aware datetime (e.g. UTC)")
    return value.timestamp()


def _pages(store: Store, where: HistoryFilter, after: int, limit: int | None, page: int) -> Iterator[list[Event]]:
    # one page at a time, in the caller's thread: prefetching the next page in a helper thread is
    # slower (the decoding in that thread fights the fold for the GIL; benchmarks/README.md)
    left = limit
    while left is None or left > 0:
        size = page if left is None else min(page, left)
        batch = store.history(where, after=after, limit=size)
        if not batch:
            return
        yield batch
        if left is not None:
            left -= len(batch)
        last = batch[-1].sequence
        assert last is not None  # stores always set it
        after = last
        if len(batch) < size:
            return


def _upcaster(upcasters: Upcasters | None) -> Upcasters:
    from outrelay.core.history.upcasting import default_upcasters

    return default_upcasters() if upcasters is None else upcasters


def scan(
    store: Store,
    *,
    stream: str | None = None,
    types: Sequence[str] = (),
    tenant: str | None = None,
    since: float | datetime | None = None,
    until: float | datetime | None = None,
    after: int = 0,
    limit: int | None = None,
    upcasters: Upcasters | None = None,
    page: int = PAGE,
) -> Iterator[Event]:
    """Events matching every given filter, in sequence order, from ``after``
    (exclusive), at most ``limit``; upcast with ``upcasters`` (default: the
    process-wide registry; pass an empty :class:`~outrelay.core.history.upcasting.Upcasters` to read
    events as stored)."""
    where = HistoryFilter(stream, tuple(types), tenant, timestamp(since), timestamp(until))
    yield from scan_where(store, where, after=after, limit=limit, upcasters=upcasters, page=page)


def scan_where(
    store: Store,
    where: HistoryFilter,
    *,
    after: int = 0,
    limit: int | None = None,
    upcasters: Upcasters | None = None,
    page: int = PAGE,
) -> Iterator[Event]:
    """:func:`scan` of a selection already made: the events ``where`` selects (its time
    bounds in Unix seconds), in sequence order, from ``after`` (exclusive), at most
    ``limit``, upcast with ``upcasters`` (default: the process-wide registry)."""
    up = _upcaster(upcasters)
    for batch in _pages(store, where, after, limit, page):
        if up:
            yield from up.upcast_all(batch)
        else:
            yield from batch


def read_stream_pages(
    store: Store, stream: str, *, after: int = 0, upcasters: Upcasters | None = None, page: int = PAGE
) -> Iterator[list[Event]]:
    """:func:`read_stream` a page (a list, in order) at a time: what folds
    loop over (a list is cheaper to walk than a generator per event)."""
    where = HistoryFilter(stream, (), None, None, None)
    up = _upcaster(upcasters)
    for batch in _pages(store, where, after, None, page):
        yield up.upcast_all(batch) if up else batch


def read_stream(
    store: Store,
    stream: str,
    *,
    after: int = 0,
    since: float | datetime | None = None,
    limit: int | None = None,
    upcasters: Upcasters | None = None,
    page: int = PAGE,
) -> Iterator[Event]:
    """One stream in order, from sequence ``after`` (exclusive) or from time
    ``since``; uses the (stream, sequence) index."""
    return scan(store, stream=stream, since=since, after=after, limit=limit, upcasters=upcasters, page=page)


async def ascan(
    store: Store,
    *,
    stream: str | None = None,
    types: Sequence[str] = (),
    tenant: str | None = None,
    since: float | datetime | None = None,
    until: float | datetime | None = None,
    after: int = 0,
    limit: int | None = None,
    upcasters: Upcasters | None = None,
    page: int = PAGE,
) -> AsyncIterator[Event]:
    """:func:`scan` for asyncio: each page is fetched in a worker thread, so
    the event loop never waits on the database."""
    where = HistoryFilter(stream, tuple(types), tenant, timestamp(since), timestamp(until))
    up = _upcaster(upcasters)
    pages = _pages(store, where, after, limit, page)
    while True:
        batch = await asyncio.to_thread(next, pages, None)
        if batch is None:
            return
        for event in up.upcast_all(batch) if up else batch:
            yield event


def aread_stream(
    store: Store,
    stream: str,
    *,
    after: int = 0,
    since: float | datetime | None = None,
    limit: int | None = None,
    upcasters: Upcasters | None = None,
    page: int = PAGE,
) -> AsyncIterator[Event]:
    """:func:`read_stream` for asyncio (see :func:`ascan`)."""
    return ascan(store, stream=stream, since=since, after=after, limit=limit, upcasters=upcasters, page=page)
