"""The SQLite outbox's operator side: status, dead letters, replay (history and
retention live in :mod:`.sqlite_history`).

A mixin of :class:`~outrelay.core.stores.sqlite.SQLiteStore` (the relay's hot
path lives there). Every write here commits durably (never ``relaxed``): an
operator's replay or purge must survive a power cut.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import NotFoundError
from outrelay.core.stores.base import DeadLetter, DestinationStatus

__all__ = ["SQLiteOperatorMixin", "SQLiteParts"]


class SQLiteParts:
    """What the SQLite store's mixins need from it: ``_tx``, ``_q``, ``_event`` and ``_cursor``."""

    if TYPE_CHECKING:

        def _tx(
            self, mode: str = "IMMEDIATE", *, relaxed: bool = False
        ) -> AbstractContextManager[sqlite3.Connection]: ...
        def _q(self, sql: str, args: Sequence[Any] = ()) -> list[Any]: ...
        @staticmethod
        def _event(seq: int, attrs: bytes | str, data: bytes) -> Event: ...
        @staticmethod
        def _cursor(db: sqlite3.Connection) -> int: ...


class SQLiteOperatorMixin(SQLiteParts):
    """The operator side of the SQLite store (status, dead letters, replay)."""

    def status(self, destinations: Sequence[str], now: float) -> list[DestinationStatus]:
        out = []
        for dest in destinations:
            pending, in_retry, oldest = self._q(
                "SELECT COUNT(*), COALESCE(SUM(attempts > 0), 0), MIN(created_at) "
                "FROM outrelay_deliveries WHERE destination = ?",
                (dest,),
            )[0]
            dead = self._q(
                "SELECT COUNT(*) FROM outrelay_dead_letters WHERE destination = ? AND state = 'dead'", (dest,)
            )[0][0]
            parked = self._q("SELECT COUNT(*) FROM outrelay_lanes WHERE destination = ? AND parked = 1", (dest,))[0][0]
            row = self._q(
                "SELECT delivered, last_error, last_error_at, disabled FROM outrelay_destinations "
                "WHERE destination = ?",
                (dest,),
            )
            totals = row[0] if row else None
            out.append(DestinationStatus.from_counts(dest, pending, in_retry, oldest, dead, parked, totals, now))
        return out

    def record_error(self, destination: str, error: str | None, now: float) -> None:
        with self._tx(relaxed=True) as db:
            db.execute(
                "INSERT INTO outrelay_destinations (destination, last_error, last_error_at) VALUES (?, ?, ?) "
                "ON CONFLICT (destination) DO UPDATE SET last_error = excluded.last_error, "
                "last_error_at = excluded.last_error_at",
                (destination, error, now if error else None),
            )

    def set_disabled(self, destination: str, reason: str | None, now: float) -> None:
        with self._tx() as db:
            db.execute(
                "INSERT INTO outrelay_destinations (destination, disabled) VALUES (?, ?) "
                "ON CONFLICT (destination) DO UPDATE SET disabled = excluded.disabled",
                (destination, reason),
            )

    def disabled(self, destination: str) -> str | None:
        row = self._q("SELECT disabled FROM outrelay_destinations WHERE destination = ?", (destination,))
        return row[0][0] if row else None

    _DL_SELECT = (
        "SELECT dl.id, e.seq, e.attrs, e.data, dl.destination, dl.reason, dl.attempts, dl.first_attempt_at, "
        "dl.failed_at, dl.state FROM outrelay_dead_letters dl JOIN outrelay_events e ON e.seq = dl.event_seq "
    )

    def _dl(self, row: Sequence[Any]) -> DeadLetter:
        return DeadLetter(row[0], self._event(row[1], row[2], row[3]), *row[4:])

    def dead_letters(
        self, *, destination: str | None = None, states: Sequence[str] = ("dead", "parked"), limit: int = 100
    ) -> list[DeadLetter]:
        marks = ",".join("?" * len(states))
        sql = self._DL_SELECT + f"WHERE dl.state IN ({marks})"
        args: list[Any] = list(states)
        if destination:
            sql += " AND dl.destination = ?"
            args.append(destination)
        return [self._dl(r) for r in self._q(sql + " ORDER BY dl.id LIMIT ?", (*args, limit))]

    def dead_letter(self, dl_id: int) -> DeadLetter:
        rows = self._q(self._DL_SELECT + "WHERE dl.id = ?", (dl_id,))
        if not rows:
            raise NotFoundError(f"no dead letter with id {dl_id}; see `outrelay dlq list`")
        return self._dl(rows[0])

    def _select_dead(
        self, db: sqlite3.Connection, ids: Sequence[int] | None, destination: str | None
    ) -> list[tuple[int, int, str, str, str, int | None]]:
        sql = (
            "SELECT id, event_seq, destination, stream, state, delivery_id FROM outrelay_dead_letters "
            "WHERE state IN ('dead','parked')"
        )
        args: list[Any] = []
        if ids is not None:
            sql += f" AND id IN ({','.join('?' * len(ids))})"
            args += list(ids)
        if destination:
            sql += " AND destination = ?"
            args.append(destination)
        return db.execute(sql + " ORDER BY id", args).fetchall()

    def replay_dead(self, ids: Sequence[int] | None, *, destination: str | None, now: float) -> int:
        with self._tx() as db:
            rows = self._select_dead(db, ids, destination)
            if ids is not None and len(rows) != len(set(ids)):
                found = {r[0] for r in rows}
                missing = [i for i in ids if i not in found]
                raise NotFoundError(f"no replayable dead letter with id {missing[0]}; see `outrelay dlq list`")
            for dl_id, seq, dest, stream, state, delivery_id in rows:
                self._requeue_dead(db, dl_id, dest, stream, seq, state, delivery_id, now)
            return len(rows)

    @classmethod
    def _requeue_dead(
        cls, db: sqlite3.Connection, dl_id: int, dest: str, stream: str, seq: int, state: str, delivery_id: int | None,
        now: float,
    ) -> None:  # fmt: skip
        """Send dead letter ``dl_id`` again: a parked head is unparked (its delivery counts from 0 and its
        lane is due now), a dead one is queued anew; the letter is marked replayed."""
        if state == "parked":
            db.execute("UPDATE outrelay_deliveries SET attempts = 0 WHERE id = ?", (delivery_id,))
            db.execute(
                "UPDATE outrelay_lanes SET parked = 0, due_at = ? WHERE destination = ? AND stream = ?",
                (now, dest, stream),
            )
        else:
            cls._enqueue(db, dest, stream, seq, now)
        db.execute("UPDATE outrelay_dead_letters SET state = 'replayed' WHERE id = ?", (dl_id,))

    @staticmethod
    def _enqueue(db: sqlite3.Connection, dest: str, stream: str, seq: int, now: float) -> None:
        db.execute(
            "INSERT INTO outrelay_deliveries (destination, stream, event_seq, created_at) VALUES (?, ?, ?, ?)",
            (dest, stream, seq, now),
        )
        db.execute(
            "INSERT INTO outrelay_lanes (destination, stream, due_at, pending) VALUES (?, ?, ?, 1) "
            "ON CONFLICT (destination, stream) DO UPDATE SET pending = pending + 1",
            (dest, stream, now),
        )

    def purge_dead(self, ids: Sequence[int] | None, *, destination: str | None) -> int:
        with self._tx() as db:
            rows = self._select_dead(db, ids, destination)
            for dl_id, _seq, dest, stream, state, delivery_id in rows:
                if state == "parked":
                    db.execute("DELETE FROM outrelay_deliveries WHERE id = ?", (delivery_id,))
                    db.execute(
                        "UPDATE outrelay_lanes SET parked = 0, pending = pending - 1, due_at = 0 "
                        "WHERE destination = ? AND stream = ?",
                        (dest, stream),
                    )
                    db.execute(
                        "DELETE FROM outrelay_lanes WHERE destination = ? AND stream = ? AND pending <= 0",
                        (dest, stream),
                    )
                db.execute("DELETE FROM outrelay_dead_letters WHERE id = ?", (dl_id,))
            return len(rows)

    def events(self, *, stream: str | None = None, after: int = 0, limit: int = 1000) -> list[Event]:
        if stream is None:
            rows = self._q(
                "SELECT seq, attrs, data FROM outrelay_events WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
            )
        else:
            rows = self._q(
                "SELECT seq, attrs, data FROM outrelay_events WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?",
                (stream, after, limit),
            )
        return [self._event(*r) for r in rows]

    def replay_stream(self, destination: str, *, stream: str | None, after: int, now: float) -> int:
        count = 0
        with self._tx() as db:
            sql = "SELECT seq, stream FROM outrelay_events WHERE seq > ? AND seq <= ?"
            args: list[Any] = [after, self._cursor(db)]
            if stream is not None:
                sql += " AND stream = ?"
                args.append(stream)
            for seq, s in db.execute(sql + " ORDER BY seq", args).fetchall():
                self._enqueue(db, destination, s, seq, now)
                count += 1
        return count
