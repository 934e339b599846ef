"""The PostgreSQL outbox's history: filtered reads, snapshots and retention.

A mixin of :class:`~outrelay.core.stores.postgres.PostgresStore`, with the
same meaning as the SQLite one. Reads page by sequence; one stream's pages
use the ``(stream, seq)`` index. Type globs become ``LIKE ANY`` patterns.
Retention deletes in short transactions of ``batch`` rows, skipping rows
another transaction holds (``SKIP LOCKED``), so it never blocks appends or
the relay.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import orjson

from outrelay.core.model.envelope import Event
from outrelay.core.model.history_filter import HistoryFilter, filter_sql
from outrelay.core.stores.base import Snapshot
from outrelay.core.stores.postgres_ops import PostgresParts

if TYPE_CHECKING:
    import psycopg

    Cursor = psycopg.Cursor[Any]

__all__ = ["HistoryMixin"]

T = TypeVar("T")


class HistoryMixin(PostgresParts):
    """History, snapshots and retention of the PostgreSQL store (also needs ``_lock_lanes``)."""

    if TYPE_CHECKING:

        def _lock_lanes(self, cur: Cursor, keys: set[tuple[str, str]]) -> None: ...

    def history(self, where: HistoryFilter, *, after: int = 0, limit: int = 1000) -> list[Event]:
        cond, args = filter_sql(where, "postgresql")
        sql = f"SELECT seq, attrs::text, data FROM {self.n.events} WHERE seq > %s{cond} ORDER BY seq LIMIT %s"
        rows = self._binary(sql, (after, *args, limit))
        # the envelope comes as text and is decoded here: the same orjson the connection's jsonb loader
        # uses, without that loader's Python call per row (less client CPU per event; benchmarks/README.md)
        decode, loads = Event.from_attributes, orjson.loads
        return [decode(loads(attrs), data, seq) for seq, attrs, data in rows]

    def history_lean(self, stream: str, *, after: int = 0, limit: int = 1000) -> list[tuple[int, str, Any, bytes]]:
        # the version is extracted by the server: sending the whole envelope costs more (jsonb to text);
        # a LeanEvent asked for its envelope reads its page again (outrelay.core.history.lean)
        return self._binary(
            f"SELECT seq, type, COALESCE(attrs->>'event_version', '1'), data FROM {self.n.events} "
            "WHERE stream = %s AND seq > %s ORDER BY seq LIMIT %s",
            (stream, after, limit),
        )

    def _binary(self, sql: str, args: Sequence[Any]) -> list[Any]:
        """Rows of ``sql`` in PostgreSQL's binary format: ``bytea`` arrives as
        raw bytes instead of hex text to decode (most of the client CPU of a
        lean history page otherwise; figures in benchmarks/README.md)."""

        def fn(cur: Cursor) -> list[Any]:
            cur.execute(sql, args, binary=True)
            return cur.fetchall()

        return self._run(fn)

    def replay_events(self, destination: str, sequences: Sequence[int], *, now: float) -> int:
        n = self.n
        if not sequences:
            return 0

        def fn(cur: Cursor) -> int:
            cur.execute(
                # locked as the deliveries' key did (FOR KEY SHARE): a prune skips them until this commits
                f"SELECT seq, stream FROM {n.events} e WHERE seq = ANY(%s) AND {n.routed('e.seq')} "
                "ORDER BY seq FOR KEY SHARE",
                (list(sequences),),
            )
            rows = cur.fetchall()
            self._lock_lanes(cur, {(destination, r[1]) for r in rows})
            counts: dict[str, int] = {}
            for _seq, stream in rows:
                counts[stream] = counts.get(stream, 0) + 1
            cur.execute(
                f"INSERT INTO {n.deliveries} (destination, stream, event_seq, created_at) "
                "SELECT %s, s, e, %s FROM unnest(%s::text[], %s::bigint[]) WITH ORDINALITY AS u(s, e, o) ORDER BY o",
                (destination, now, [r[1] for r in rows], [r[0] for r in rows]),
            )
            streams = sorted(counts)  # lanes in the global (destination, stream) order
            cur.execute(
                f"INSERT INTO {n.lanes} (destination, stream, due_at, pending) "
                "SELECT %s, s, %s, c FROM unnest(%s::text[], %s::int[]) WITH ORDINALITY AS u(s, c, o) ORDER BY o "
                f"ON CONFLICT (destination, stream) DO UPDATE SET pending = {n.lanes}.pending + excluded.pending",
                (destination, now, streams, [counts[s] for s in streams]),
            )
            return len(rows)

        return self._run(fn)

    def save_snapshot(self, snapshot: Snapshot) -> None:
        s = snapshot
        self._q(
            f"INSERT INTO {self.n.snapshots} (name, stream, version, seq, events, state, created_at) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (name, stream) DO UPDATE SET version = excluded.version, "
            "seq = excluded.seq, events = excluded.events, state = excluded.state, created_at = excluded.created_at "
            "RETURNING seq",
            (s.name, s.stream, s.version, s.sequence, s.events, s.state, s.created_at),
        )

    def load_snapshot(self, name: str, stream: str) -> Snapshot | None:
        rows = self._q(
            f"SELECT name, stream, version, seq, events, state, created_at FROM {self.n.snapshots} "
            "WHERE name = %s AND stream = %s",
            (name, stream),
        )
        if not rows:
            return None
        r = rows[0]
        return Snapshot(r[0], r[1], r[2], r[3], r[4], bytes(r[5]), r[6])

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
        n = self.n
        conds = []
        args: list[Any] = []
        if older_than is not None:
            conds.append("e.time < %s")
            args.append(older_than)
        if keep_last is not None and keep_last <= 0:
            conds.append("true")
        elif keep_last is not None:
            # the keep_last-th newest sequence of the stream, through the (stream, seq) index
            conds.append(
                f"e.seq < (SELECT k.seq FROM {n.events} k WHERE k.stream = e.stream ORDER BY k.seq DESC "
                "LIMIT 1 OFFSET %s)"
            )
            args.append(keep_last - 1)
        if not conds:
            return 0
        sql = (
            f"DELETE FROM {n.events} WHERE seq IN (SELECT seq FROM {n.events} e "
            f"WHERE {n.routed('e.seq')} AND ({' OR '.join(conds)}) "
            f"AND NOT EXISTS (SELECT 1 FROM {n.deliveries} d WHERE d.event_seq = e.seq) "
            f"AND NOT EXISTS (SELECT 1 FROM {n.dead_letters} dl WHERE dl.event_seq = e.seq) "
            "ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED)"
        )

        def one(cur: Cursor) -> int:
            cur.execute(sql, (*args, batch))
            return cur.rowcount

        total = done = 0
        while max_batches is None or done < max_batches:
            removed = self._run(one)
            total += removed
            done += 1
            if removed < batch:
                break
        return total
