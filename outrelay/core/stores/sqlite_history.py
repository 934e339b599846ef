"""The SQLite outbox's history: filtered reads, snapshots and retention.

A mixin of :class:`~outrelay.core.stores.sqlite.SQLiteStore`. Reads page by
sequence; one stream's pages use the (stream, seq) index, so their cost does
not grow with other streams' rows. Type globs run as ``GLOB`` (SQLite's own
shell-style, case-sensitive match). Retention deletes in short transactions
of ``batch`` rows, releasing the store's lock between them.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson

from outrelay.core.model.envelope import Event
from outrelay.core.model.history_filter import HistoryFilter, filter_sql
from outrelay.core.stores.base import Snapshot
from outrelay.core.stores.sqlite_ops import SQLiteParts

__all__ = ["SQLiteHistoryMixin"]

#: an event something still refers to (a pending delivery, a dead letter) is never pruned
_KEEP = (
    "AND e.seq NOT IN (SELECT event_seq FROM outrelay_deliveries) "
    "AND NOT EXISTS (SELECT 1 FROM outrelay_dead_letters dl WHERE dl.event_seq = e.seq) "
)


class SQLiteHistoryMixin(SQLiteParts):
    """History, snapshots and retention of the SQLite store (also needs ``_enqueue``)."""

    if TYPE_CHECKING:

        @staticmethod
        def _enqueue(db: sqlite3.Connection, dest: str, stream: str, seq: int, now: float) -> None: ...

    def history(self, where: HistoryFilter, *, after: int = 0, limit: int = 1000) -> list[Event]:
        cond, args = filter_sql(where, "sqlite")
        sql = f"SELECT seq, attrs, data FROM outrelay_events WHERE seq > ?{cond} ORDER BY seq LIMIT ?"
        rows = self._q(sql, (after, *args, limit))
        # the replay hot path: bound locals, no per-row method call (about 10 % of a fold's time)
        decode, loads = Event.from_attributes, orjson.loads
        return [decode(loads(attrs), data, seq) for seq, attrs, data in rows]

    def history_lean(self, stream: str, *, after: int = 0, limit: int = 1000) -> list[tuple[int, str, Any, bytes]]:
        # the envelope JSON goes out undecoded in place of the version: read_lean() looks the version up
        # only for types that have upcasters (a per-row lookup is a large share of a lean fold; benchmarks/README.md)
        rows: list[tuple[int, str, Any, bytes]] = self._q(
            "SELECT seq, type, attrs, data FROM outrelay_events WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?",
            (stream, after, limit),
        )
        return rows

    def replay_events(self, destination: str, sequences: Sequence[int], *, now: float) -> int:
        if not sequences:
            return 0
        with self._tx() as db:
            marks = ",".join("?" * len(sequences))
            rows = db.execute(
                f"SELECT seq, stream FROM outrelay_events WHERE seq IN ({marks}) AND seq <= ? ORDER BY seq",
                (*sequences, self._cursor(db)),  # at or below the route cursor: routed
            ).fetchall()
            for seq, stream in rows:
                self._enqueue(db, destination, stream, seq, now)
        return len(rows)

    def save_snapshot(self, snapshot: Snapshot) -> None:
        s = snapshot
        with self._tx() as db:
            db.execute(
                "INSERT OR REPLACE INTO outrelay_snapshots (name, stream, version, seq, events, state, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (s.name, s.stream, s.version, s.sequence, s.events, s.state, s.created_at),
            )

    def load_snapshot(self, name: str, stream: str) -> Snapshot | None:
        rows = self._q(
            "SELECT name, stream, version, seq, events, state, created_at FROM outrelay_snapshots "
            "WHERE name = ? AND stream = ?",
            (name, stream),
        )
        return Snapshot(*rows[0]) if rows else None

    def prune(
        self,
        older_than: float | None,
        *,
        keep_last: int | None = None,
        batch: int = 1000,
        max_batches: int | None = None,
    ) -> int:
        """See :meth:`Store.prune`; ``max_batches`` stops after that many
        transactions (the relay runs one at a time, between deliveries)."""
        conds = []
        args: list[Any] = []
        if older_than is not None:
            conds.append("e.time < ?")
            args.append(older_than)
        if keep_last is not None and keep_last <= 0:
            conds.append("1 = 1")
        elif keep_last is not None:
            # the keep_last-th newest sequence of the stream, through the (stream, seq) index
            conds.append(
                "e.seq < (SELECT k.seq FROM outrelay_events k WHERE k.stream = e.stream "
                "ORDER BY k.seq DESC LIMIT 1 OFFSET ?)"
            )
            args.append(keep_last - 1)
        if not conds:
            return 0
        total = done = 0
        while max_batches is None or done < max_batches:
            with self._tx() as db:
                cur = db.execute(
                    "DELETE FROM outrelay_events WHERE seq IN (SELECT e.seq FROM outrelay_events e "
                    f"WHERE e.seq <= ? AND ({' OR '.join(conds)}) {_KEEP} ORDER BY e.seq LIMIT ?)",
                    (self._cursor(db), *args, batch),
                )
                removed = cur.rowcount
            total += removed
            done += 1
            if removed < batch:
                break
        return total
