"""The delivery-attempt log in the SQLite outbox (see :mod:`outrelay.core.relay.attempts`).

A mixin of :class:`~outrelay.core.stores.sqlite.SQLiteStore`. The relay's
settle writes a batch's attempts inside its own transaction
(:meth:`SQLiteAttemptsMixin._log_attempts`: its plain delivered ones with one
``INSERT ... SELECT`` from their events' rows, any other with an
``executemany``); nothing here runs
on the hot path unless the relay passes attempts (``[attempts] enabled``). Reads page newest
first by ``id``; an ``--event`` read uses the index on ``(event_seq, id)``
(the sequence found from the event's id; an event pruned from history is
matched by id, a scan), the others scan from the newest row (the table is
bounded by retention).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from operator import itemgetter
from typing import TYPE_CHECKING, Any

import orjson

from outrelay.core.model.errors import NotFoundError
from outrelay.core.stores.base import Attempt
from outrelay.core.stores.sqlite_ops import SQLiteParts

__all__ = ["SQLiteAttemptsMixin"]

_COLS = "id, at, event_id, event_seq, destination, stream, attempt, outcome, latency, error, detail"
_INSERT_DELIVERED = (
    "INSERT INTO outrelay_attempts (at, event_id, event_seq, destination, stream, attempt, outcome, latency) "
    "SELECT ?, e.id, e.seq, ?, e.stream, ?, 'delivered', ? FROM json_each(?) j "
    "CROSS JOIN outrelay_events e ON e.seq = j.value"
)
_FOUND = "SELECT seq FROM outrelay_events WHERE seq IN (SELECT value FROM json_each(?))"
#: whether this SQLite has ``json_each`` (built in since 3.38, an option before); cleared on the first miss
_JSON = [True]
_KIND = itemgetter(0, 5, 6, 7, 8, 9)
_SEQ = itemgetter(2)


class SQLiteAttemptsMixin(SQLiteParts):
    """Writes, reads and prunes ``outrelay_attempts``; ``retry_event`` for ``outrelay retry``."""

    #: ``[attempts] keep_per_event``: older attempts of an (event, destination) go when a newer one is written
    attempts_keep: int | None = None

    def _log_attempts(self, db: sqlite3.Connection, destination: str, rows: Sequence[Attempt]) -> None:
        """Insert the attempt-log ``rows`` (in the caller's transaction).

        A delivered attempt with no error or detail (most rows) takes its ``event_id`` and
        ``stream`` from its event's row, which the settle's transaction still holds: those of a
        batch sharing ``at``, ``latency`` and attempt number go in one ``INSERT ... SELECT`` that
        binds only their sequences (as one JSON array), not ten values per row. Any other row,
        and one whose event is gone or listed twice, is inserted with its own values."""
        keep = self.attempts_keep
        alike: tuple[float, int, float] | None = getattr(rows, "plain", None)  # AttemptRows: all alike
        if keep is not None and (alike is None or alike[1] > keep):  # only past keep attempts (replays aside)
            for r in rows:
                if r[5] > keep:  # (at, event_id, event_seq, destination, stream, attempt, ...)
                    db.execute(
                        "DELETE FROM outrelay_attempts WHERE event_seq = ? AND destination = ? AND id NOT IN "
                        "(SELECT id FROM outrelay_attempts WHERE event_seq = ? AND destination = ? "
                        "ORDER BY id DESC LIMIT ?)",
                        (r[2], destination, r[2], destination, keep - 1),
                    )
        rest: Sequence[Attempt] = rows
        if alike is not None and _JSON[0]:
            rest = self._log_delivered(db, destination, *alike, rows, getattr(rows, "seqs", None))
        elif _JSON[0]:
            kinds = set(map(_KIND, rows))  # (at, attempt, outcome, latency, error, detail): a batch's often share one
            if len(kinds) == 1:
                at, number, outcome, latency, error, detail = kinds.pop()
                if outcome == "delivered" and not error and not detail:
                    rest = self._log_delivered(db, destination, at, number, latency, rows)
            else:
                plain: dict[tuple[float, int, float], list[Attempt]] = {}
                rest = []
                for r in rows:
                    if r[6] == "delivered" and not r[8] and not r[9]:
                        plain.setdefault((r[0], r[5], r[7]), []).append(r)
                    else:
                        rest.append(r)
                for (at, number, latency), group in plain.items():
                    rest.extend(self._log_delivered(db, destination, at, number, latency, group))
        if rest:
            db.executemany(
                "INSERT INTO outrelay_attempts (at, event_id, event_seq, destination, stream, attempt, outcome, "
                "latency, error, detail) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                rest,
            )

    @staticmethod
    def _log_delivered(
        db: sqlite3.Connection,
        destination: str,
        at: float,
        number: int,
        latency: float,
        group: Sequence[Attempt],
        known: list[int] | None = None,
    ) -> Sequence[Attempt]:
        """Insert the plain delivered attempts ``group`` (in sequence order) from their events'
        rows (``known``: their sequences, if the caller has them); returns those left to insert
        with their own values: an event no longer in the outbox, or all of them where this
        SQLite has no ``json_each``."""
        seqs = orjson.dumps(sorted(known if known is not None else map(_SEQ, group))).decode()
        try:
            got = db.execute(_INSERT_DELIVERED, (at, destination, number, latency, seqs)).rowcount
        except sqlite3.OperationalError as exc:  # built without JSON: row by row from now on
            if "json_each" not in str(exc):
                raise
            _JSON[0] = False
            return group
        if got == len(group):
            return ()
        found = {s for (s,) in db.execute(_FOUND, (seqs,))}
        return [r for r in group if r[2] not in found]

    def attempts(
        self,
        *,
        event_id: str | None = None,
        stream: str | None = None,
        destination: str | None = None,
        since: float | None = None,
        limit: int = 100,
    ) -> list[tuple[Any, ...]]:
        """Logged attempts matching every filter given, newest first, at most ``limit``: rows
        of ``id, at, event_id, event_seq, destination, stream, attempt, outcome, latency, error, detail``."""
        seq = None
        if event_id is not None:  # by the indexed sequence; an event pruned from the log: by id (a scan)
            found = self._q("SELECT seq FROM outrelay_events WHERE id = ?", (event_id,))
            seq = int(found[0][0]) if found else None
        where, args = _filters(event_id, stream, destination, since, seq=seq)
        sql = f"SELECT {_COLS} FROM outrelay_attempts{where} ORDER BY id DESC LIMIT ?"
        return [tuple(r) for r in self._q(sql, (*args, limit))]

    def prune_attempts(self, older_than: float, *, batch: int = 1000) -> int:
        """Delete up to ``batch`` of the oldest attempts logged before ``older_than``; returns the count.
        Rows are taken in ``id`` order, so one later than a newer row waits until that one goes too."""
        with self._tx(relaxed=True) as db:
            return db.execute(
                "DELETE FROM outrelay_attempts WHERE id IN "
                "(SELECT id FROM outrelay_attempts ORDER BY id LIMIT ?) AND at < ?",
                (batch, older_than),
            ).rowcount

    def retry_event(
        self, event_id: str, *, destination: str | None, redeliver: bool, now: float
    ) -> list[tuple[str, str]]:
        """Send event ``event_id`` again now (see :func:`outrelay.core.relay.attempts.retry_event`).

        :raises NotFoundError: no such event."""
        with self._tx() as db:
            row = db.execute("SELECT seq, stream FROM outrelay_events WHERE id = ?", (event_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no event with id {event_id!r} in the outbox")
            seq, stream = int(row[0]), str(row[1])
            out: list[tuple[str, str]] = []
            pending = db.execute(
                "SELECT DISTINCT destination FROM outrelay_deliveries WHERE event_seq = ?", (seq,)
            ).fetchall()
            for (dest,) in pending:
                if destination is not None and dest != destination:
                    continue
                lane = db.execute(
                    "SELECT parked, owner FROM outrelay_lanes WHERE destination = ? AND stream = ?", (dest, stream)
                ).fetchone()
                if lane is not None and lane[0]:
                    continue  # a parked head: its dead letter below
                db.execute(
                    "UPDATE outrelay_lanes SET due_at = ? WHERE destination = ? AND stream = ? AND owner IS NULL",
                    (now, dest, stream),
                )
                out.append((dest, "due now" if lane is None or lane[1] is None else "in flight"))
            dead = db.execute(
                "SELECT id, destination, state, delivery_id FROM outrelay_dead_letters "
                "WHERE event_seq = ? AND state IN ('dead', 'parked') ORDER BY id",
                (seq,),
            ).fetchall()
            for dl_id, dest, state, delivery_id in dead:
                if destination is not None and dest != destination:
                    continue
                self._requeue_dead(db, dl_id, dest, stream, seq, state, delivery_id, now)
                out.append((dest, f"{state} letter {dl_id} queued again"))
            if out or not redeliver:
                return out
            if destination is None:
                raise NotFoundError("--redeliver needs --destination (the event is pending nowhere)")
            self._enqueue(db, destination, stream, seq, now)
            return [(destination, "queued again")]

    if TYPE_CHECKING:  # provided by SQLiteOperatorMixin

        @staticmethod
        def _enqueue(db: sqlite3.Connection, dest: str, stream: str, seq: int, now: float) -> None: ...
        @classmethod
        def _requeue_dead(
            cls, db: sqlite3.Connection, dl_id: int, dest: str, stream: str, seq: int, state: str,
            delivery_id: int | None, now: float,
        ) -> None: ...  # fmt: skip


def _filters(
    event_id: str | None,
    stream: str | None,
    destination: str | None,
    since: float | None,
    mark: str = "?",
    *,
    seq: int | None = None,
) -> tuple[str, list[Any]]:
    """The WHERE clause (with a leading space, or empty) and its arguments; ``seq``: the event's
    sequence, which the index covers (``event_id`` is then matched too)."""
    parts: list[str] = []
    args: list[Any] = []
    columns = (("event_seq", seq), ("event_id", event_id), ("stream", stream), ("destination", destination))
    for column, value in columns:
        if value is not None:
            parts.append(f"{column} = {mark}")
            args.append(value)
    if since is not None:
        parts.append(f"at >= {mark}")
        args.append(since)
    return (" WHERE " + " AND ".join(parts) if parts else ""), args
