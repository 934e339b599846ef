"""Operator side of the PostgreSQL outbox: status, dead letters, replay and
purge — the same meaning as the SQLite store (history reads, snapshots and
retention live in :mod:`.postgres_history`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import NotFoundError
from outrelay.core.stores.base import DeadLetter, DestinationStatus

if TYPE_CHECKING:
    import psycopg

    from outrelay.core.stores.postgres_schema import Names

    Cursor = psycopg.Cursor[Any]

__all__ = ["OperatorMixin", "PostgresParts"]

T = TypeVar("T")


class PostgresParts:
    """What the PostgreSQL store's mixins need from it: ``n`` (table names), ``_run``, ``_q`` and ``_event``."""

    n: Names

    if TYPE_CHECKING:

        def _run(self, fn: Callable[[Cursor], T], *, reconnect: bool = True) -> T: ...
        def _q(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[Any]: ...
        @staticmethod
        def _event(seq: int, attrs: Any, data: bytes) -> Event: ...


class OperatorMixin(PostgresParts):
    """The operator side of the PostgreSQL store (status, dead letters, replay)."""

    def status(self, destinations: Sequence[str], now: float) -> list[DestinationStatus]:
        n = self.n

        def fn(cur: Cursor) -> list[DestinationStatus]:
            out = []
            for dest in destinations:
                cur.execute(
                    "SELECT COUNT(*), COUNT(*) FILTER (WHERE attempts > 0), MIN(created_at) "
                    f"FROM {n.deliveries} WHERE destination = %s",
                    (dest,),
                )
                pending, in_retry, oldest = cur.fetchone()  # type: ignore[misc]
                cur.execute(f"SELECT COUNT(*) FROM {n.dead_letters} WHERE destination = %s AND state = 'dead'", (dest,))
                dead = cur.fetchone()[0]  # type: ignore[index]
                cur.execute(f"SELECT COUNT(*) FROM {n.lanes} WHERE destination = %s AND parked", (dest,))
                parked = cur.fetchone()[0]  # type: ignore[index]
                cur.execute(
                    f"SELECT delivered, last_error, last_error_at, disabled FROM {n.destinations} "
                    "WHERE destination = %s",
                    (dest,),
                )
                row = cur.fetchone()
                out.append(DestinationStatus.from_counts(dest, pending, in_retry, oldest, dead, parked, row, now))
            return out

        return self._run(fn)

    def record_error(self, destination: str, error: str | None, now: float) -> None:
        self._q(
            f"INSERT INTO {self.n.destinations} (destination, last_error, last_error_at) VALUES (%s, %s, %s) "
            "ON CONFLICT (destination) DO UPDATE SET last_error = excluded.last_error, "
            "last_error_at = excluded.last_error_at RETURNING destination",
            (destination, error, now if error else None),
        )

    def set_disabled(self, destination: str, reason: str | None, now: float) -> None:
        self._q(
            f"INSERT INTO {self.n.destinations} (destination, disabled) VALUES (%s, %s) "
            "ON CONFLICT (destination) DO UPDATE SET disabled = excluded.disabled RETURNING destination",
            (destination, reason),
        )

    def disabled(self, destination: str) -> str | None:
        row = self._q(f"SELECT disabled FROM {self.n.destinations} WHERE destination = %s", (destination,))
        return row[0][0] if row else None

    # -- dead letters -------------------------------------------------------------

    def _dl_select(self) -> str:
        return (
            "SELECT dl.id, e.seq, e.attrs, e.data, dl.destination, dl.reason, dl.attempts, dl.first_attempt_at, "
            f"dl.failed_at, dl.state FROM {self.n.dead_letters} dl JOIN {self.n.events} e ON e.seq = dl.event_seq "
        )

    def _dl(self, row: Sequence[Any]) -> DeadLetter:
        return DeadLetter(row[0], self._event(row[1], row[2], row[3]), *row[4:])

    def dead_letters(
        self, *, destination: str | None = None, states: Sequence[str] = ("dead", "parked"), limit: int = 100
    ) -> list[DeadLetter]:
        sql = self._dl_select() + "WHERE dl.state = ANY(%s)"
        args: list[Any] = [list(states)]
        if destination:
            sql += " AND dl.destination = %s"
            args.append(destination)
        return [self._dl(r) for r in self._q(sql + " ORDER BY dl.id LIMIT %s", (*args, limit))]

    def dead_letter(self, dl_id: int) -> DeadLetter:
        rows = self._q(self._dl_select() + "WHERE dl.id = %s", (dl_id,))
        if not rows:
            raise NotFoundError(f"no dead letter with id {dl_id}; see `outrelay dlq list`")
        return self._dl(rows[0])

    def _select_dead(self, cur: Cursor, ids: Sequence[int] | None, destination: str | None) -> list[Any]:
        sql = (
            f"SELECT id, event_seq, destination, stream, state, delivery_id FROM {self.n.dead_letters} "
            "WHERE state IN ('dead', 'parked')"
        )
        args: list[Any] = []
        if ids is not None:
            sql += " AND id = ANY(%s)"
            args.append(list(ids))
        if destination:
            sql += " AND destination = %s"
            args.append(destination)
        cur.execute(sql + " ORDER BY id FOR UPDATE", args)
        return cur.fetchall()

    def _lock_lanes(self, cur: Cursor, keys: set[tuple[str, str]]) -> None:
        """Lock the lanes touched, in the global (destination, stream) order."""
        for dest, stream in sorted(keys):
            cur.execute(
                f"SELECT 1 FROM {self.n.lanes} WHERE destination = %s AND stream = %s FOR UPDATE", (dest, stream)
            )

    def _requeue_dead(
        self, cur: Cursor, dl_id: int, dest: str, stream: str, seq: int, state: str, delivery_id: int | None, now: float
    ) -> None:
        """Send dead letter ``dl_id`` again: a parked head is unparked (its delivery counts from 0 and its
        lane is due now), a dead one is queued anew; the letter is marked replayed. The caller holds the lane."""
        n = self.n
        if state == "parked":
            cur.execute(f"UPDATE {n.deliveries} SET attempts = 0 WHERE id = %s", (delivery_id,))
            cur.execute(
                f"UPDATE {n.lanes} SET parked = false, due_at = %s WHERE destination = %s AND stream = %s",
                (now, dest, stream),
            )
        else:
            self._enqueue(cur, dest, stream, seq, now)
        cur.execute(f"UPDATE {n.dead_letters} SET state = 'replayed' WHERE id = %s", (dl_id,))

    def _enqueue(self, cur: Cursor, dest: str, stream: str, seq: int, now: float) -> None:
        n = self.n
        cur.execute(
            f"INSERT INTO {n.deliveries} (destination, stream, event_seq, created_at) VALUES (%s, %s, %s, %s)",
            (dest, stream, seq, now),
        )
        cur.execute(
            f"INSERT INTO {n.lanes} (destination, stream, due_at, pending) VALUES (%s, %s, %s, 1) "
            f"ON CONFLICT (destination, stream) DO UPDATE SET pending = {n.lanes}.pending + 1",
            (dest, stream, now),
        )

    def replay_dead(self, ids: Sequence[int] | None, *, destination: str | None, now: float) -> int:
        def fn(cur: Cursor) -> int:
            rows = self._select_dead(cur, ids, destination)
            if ids is not None and len(rows) != len(set(ids)):
                found = {r[0] for r in rows}
                missing = [i for i in ids if i not in found]
                raise NotFoundError(f"no replayable dead letter with id {missing[0]}; see `outrelay dlq list`")
            self._lock_lanes(cur, {(r[2], r[3]) for r in rows})
            for dl_id, seq, dest, stream, state, delivery_id in rows:
                self._requeue_dead(cur, dl_id, dest, stream, seq, state, delivery_id, now)
            return len(rows)

        return self._run(fn)

    def purge_dead(self, ids: Sequence[int] | None, *, destination: str | None) -> int:
        n = self.n

        def fn(cur: Cursor) -> int:
            rows = self._select_dead(cur, ids, destination)
            self._lock_lanes(cur, {(r[2], r[3]) for r in rows if r[4] == "parked"})
            for dl_id, _seq, dest, stream, state, delivery_id in rows:
                if state == "parked":
                    cur.execute(f"DELETE FROM {n.deliveries} WHERE id = %s", (delivery_id,))
                    cur.execute(
                        f"UPDATE {n.lanes} SET parked = false, pending = pending - 1, due_at = 0 "
                        "WHERE destination = %s AND stream = %s",
                        (dest, stream),
                    )
                    cur.execute(
                        f"DELETE FROM {n.lanes} WHERE destination = %s AND stream = %s AND pending <= 0", (dest, stream)
                    )
                cur.execute(f"DELETE FROM {n.dead_letters} WHERE id = %s", (dl_id,))
            return len(rows)

        return self._run(fn)

    # -- history ------------------------------------------------------------------

    def events(self, *, stream: str | None = None, after: int = 0, limit: int = 1000) -> list[Event]:
        if stream is None:
            rows = self._q(
                f"SELECT seq, attrs, data FROM {self.n.events} WHERE seq > %s ORDER BY seq LIMIT %s", (after, limit)
            )
        else:
            rows = self._q(
                f"SELECT seq, attrs, data FROM {self.n.events} WHERE stream = %s AND seq > %s ORDER BY seq LIMIT %s",
                (stream, after, limit),
            )
        return [self._event(*r) for r in rows]

    def replay_stream(self, destination: str, *, stream: str | None, after: int, now: float) -> int:
        n = self.n

        def fn(cur: Cursor) -> int:
            where = f"seq > %(after)s AND {n.routed(f'{n.events}.seq')}" + (
                " AND stream = %(stream)s" if stream is not None else ""
            )
            args: dict[str, Any] = {"after": after, "stream": stream}
            cur.execute(f"SELECT DISTINCT stream FROM {n.events} WHERE {where} ORDER BY stream", args)
            self._lock_lanes(cur, {(destination, r[0]) for r in cur.fetchall()})
            # the events are locked as they are queued (FOR KEY SHARE: a prune skips them), and the lanes
            # count exactly the deliveries inserted
            cur.execute(
                f"WITH ins AS (INSERT INTO {n.deliveries} (destination, stream, event_seq, created_at) "
                f"  SELECT %(dest)s, stream, seq, %(now)s FROM (SELECT stream, seq FROM {n.events} WHERE {where} "
                "  ORDER BY seq FOR KEY SHARE) e ORDER BY seq RETURNING stream), "
                f"up AS (INSERT INTO {n.lanes} (destination, stream, due_at, pending) "
                "  SELECT %(dest)s, stream, %(now)s, count(*) FROM ins GROUP BY stream ORDER BY stream "
                f"  ON CONFLICT (destination, stream) DO UPDATE SET pending = {n.lanes}.pending + excluded.pending) "
                "SELECT count(*) FROM ins",
                {"dest": destination, "now": now, **args},
            )
            return int(cur.fetchone()[0])  # type: ignore[index]

        return self._run(fn)
