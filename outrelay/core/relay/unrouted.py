"""Unrouted events: appended, routed, and delivered nowhere because no destination matched.

An event no route matches (or whose tenant every matching destination
refuses) is not an error of the relay — a route may leave events out on
purpose — but it is easy to do by mistake (a route for tenant ``acme`` and an
event appended without a tenant). So the relay makes each one visible:

* one WARNING per event type and reason, the first time this relay sees it
  (the router counts every one, see :meth:`Router.take_unrouted`);
* counts per reason in the run summary (``RunSummary.unrouted``) and in
  ``/metrics`` (``outrelay_unrouted_events_total{reason}``), for this process;
* counts per reason and type in the outbox database, table
  ``outrelay_unrouted_counts`` (created on first use, like the inbox), which
  ``outrelay status`` shows for every relay of the outbox together.

The table lives next to the outbox (SQLite, or PostgreSQL in the outbox's
schema with its table prefix); another store keeps no counts. Writing it is
best effort: a database failure keeps the counts for the next write and never
stops routing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any

from outrelay.core.model.errors import StoreError
from outrelay.core.relay.routing import UNROUTED_REASONS, Router
from outrelay.core.stores.sidetables import SideTable, Wording, side_table

__all__ = ["UnroutedReport", "read_unrouted"]

log = logging.getLogger("outrelay.relay")

Counts = dict[tuple[str, str], int]

#: seconds between two writes of the counts (a steady flow of unrouted events costs one write a second)
FLUSH_EVERY = 1.0

_DDL = (
    "CREATE TABLE IF NOT EXISTS {t} (reason TEXT NOT NULL, type TEXT NOT NULL, count BIGINT NOT NULL, "
    "first_at DOUBLE PRECISION NOT NULL, last_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (reason, type))"
)
_UPSERT = (
    "INSERT INTO {t} (reason, type, count, first_at, last_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (reason, type) "
    "DO UPDATE SET count = {t}.count + excluded.count, last_at = excluded.last_at"
)
#: the table's errors as they were worded before it was a side table
_WORDING = Wording(
    cannot_open="cannot open {path!r}: {exc}",
    sqlite="unrouted counts in {path!r}: {exc}",
    postgres="unrouted counts in the PostgreSQL outbox: {exc}",
    where=lambda url: url.split("@")[-1],
)


class UnroutedReport:
    """The relay's side (see the module docstring): :meth:`note` after each routing."""

    def __init__(self, router: Router, url: str, db: Callable[..., Awaitable[Any]]) -> None:
        self.router = router
        self.url = url
        self._db = db
        #: this process's unrouted events by (reason, type)
        self.totals: Counter[tuple[str, str]] = Counter()
        self._unsaved: Counter[tuple[str, str]] = Counter()
        self._flush: asyncio.Task[None] | None = None

    def by_reason(self) -> dict[str, int]:
        """This process's unrouted events per reason (only reasons seen)."""
        out: Counter[str] = Counter()
        for (reason, _), n in self.totals.items():
            out[reason] += n
        return dict(out)

    def note(self) -> None:
        """In the event loop, after a routing: log new types, count, and schedule a write."""
        taken = self.router.take_unrouted()
        if not taken:
            return
        for (reason, type_), n in taken.items():
            if (reason, type_) not in self.totals:
                log.warning(
                    "event type %r routed nowhere: %s; such events are not delivered (counted in `outrelay status`)",
                    type_,
                    UNROUTED_REASONS.get(reason, reason),
                    extra={"event_type": type_, "reason": reason},
                )
            self.totals[(reason, type_)] += n
        self._unsaved.update(taken)
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._write())

    async def _write(self) -> None:
        await asyncio.sleep(FLUSH_EVERY)  # gather a second's worth into one write
        counts, self._unsaved = self._unsaved, Counter()
        try:
            await self._db(add_unrouted, self.url, dict(counts), time.time())
        except (StoreError, OSError, sqlite3.Error) as exc:
            self._unsaved.update(counts)  # written with the next ones
            log.debug("could not record unrouted events (%s); retrying with the next ones", exc)

    async def close(self) -> None:
        """Write what is still unwritten (at most one more write; failures are logged)."""
        if self._flush is not None and not self._flush.done():
            self._flush.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._flush
        if self._unsaved:
            counts, self._unsaved = dict(self._unsaved), Counter()
            try:
                await self._db(add_unrouted, self.url, counts, time.time())
            except (StoreError, OSError, sqlite3.Error) as exc:
                log.warning("could not record %d unrouted event(s) (%s)", sum(counts.values()), exc)


def add_unrouted(url: str, counts: Mapping[tuple[str, str], int], now: float) -> None:
    """Add ``counts`` to the table of the outbox at ``url`` (blocking; creates the table).

    :raises StoreError: the database failed.
    """
    with _connect(url, create=True) as t:
        if t is None:
            return
        t.execute(_DDL)
        for (reason, type_), n in sorted(counts.items()):
            t.execute(_UPSERT, (reason, type_, n, now, now))


def read_unrouted(url: str) -> dict[str, dict[str, Any]] | None:
    """The recorded unrouted events of the outbox at ``url``: ``{reason: {"count": N, "types":
    {type: n}, "last_at": T}}`` (``{}`` when none were recorded; None when this kind of store
    keeps no counts). Creates nothing.

    :raises StoreError: the database failed.
    """
    with _connect(url, create=False) as t:
        if t is None:
            return None
        if not t.exists():
            return {}
        rows = t.execute("SELECT reason, type, count, last_at FROM {t} ORDER BY reason, type").fetchall()
    out: dict[str, dict[str, Any]] = {}
    for reason, type_, count, last_at in rows:
        entry = out.setdefault(reason, {"count": 0, "types": {}, "last_at": 0.0})
        entry["count"] += int(count)
        entry["types"][type_] = int(count)
        entry["last_at"] = max(entry["last_at"], float(last_at))
    return out


def _connect(url: str, *, create: bool) -> AbstractContextManager[SideTable | None]:
    """The counts' side table of the outbox at ``url`` (see :func:`side_table`), worded as before."""
    return side_table(url, "unrouted_counts", create=create, timeout=5, wording=_WORDING)
