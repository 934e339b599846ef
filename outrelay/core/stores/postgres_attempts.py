"""The delivery-attempt log in the PostgreSQL outbox (see :mod:`outrelay.core.relay.attempts`).

A mixin of :class:`~outrelay.core.stores.postgres.PostgresStore`. On the
relay's hot path (a batch settled in one message, :mod:`.postgres_script`)
the attempts go as one more ``EXECUTE`` of that message: one ``INSERT ...
SELECT FROM unnest(arrays)``, no extra round trip. The statement-at-a-time
settle (failures to record, the audit chain, an event past
``keep_per_event``) runs the same insert in its transaction. Nothing here
runs on the hot path unless the relay passes attempts (``[attempts] enabled``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from outrelay.core.model.errors import NotFoundError
from outrelay.core.stores.base import Attempt
from outrelay.core.stores.postgres_ops import PostgresParts
from outrelay.core.stores.postgres_script import Statement, statement
from outrelay.core.stores.sqlite_attempts import _filters

if TYPE_CHECKING:
    import psycopg

    Cursor = psycopg.Cursor[Any]

__all__ = ["PostgresAttemptsMixin"]

_COLS = "id, at, event_id, event_seq, destination, stream, attempt, outcome, latency, error, detail"

#: the attempts of a settled batch, from :func:`attempt_args`: ``at`` and ``latency`` are the batch's;
#: an empty ``a_out`` / ``a_err`` / ``a_det`` array means every row's is 'delivered' / '' / ''
#: (unnest pads a shorter array with NULLs), which spares quoting a thousand equal values
_INSERT = (
    "INSERT INTO {t} (at, event_id, event_seq, destination, stream, attempt, outcome, latency, error, detail) "
    "SELECT %(a_at)s, a.ev, a.seq, %(dest)s, a.stream, a.n, COALESCE(a.out, 'delivered'), %(a_lat)s, "
    "COALESCE(a.err, ''), COALESCE(a.det, '') FROM unnest("
    "%(a_ev)s::text[], %(a_seq)s::bigint[], %(a_stream)s::text[], %(a_n)s::integer[], "
    "%(a_out)s::text[], %(a_err)s::text[], %(a_det)s::text[]) a(ev, seq, stream, n, out, err, det) "
    "WHERE a.ev IS NOT NULL"
)


def attempt_args(rows: Sequence[Attempt], keep: int | None) -> tuple[dict[str, Any], list[int]] | None:
    """The insert's arguments for ``rows`` (None for none), and the sequences of the events among
    them past ``keep`` attempts (to trim first). Every attempt of one settle shares ``at`` and
    ``latency`` (the relay's do: those of its batch): the first row's are taken."""
    if not rows:
        return None
    alike = getattr(rows, "plain", None)  # AttemptRows of plain attempts: one attempt number for all
    trim = [r[2] for r in rows if r[5] > keep] if keep is not None and (alike is None or alike[1] > keep) else []
    out = [r[6] for r in rows]
    err = [r[8] for r in rows]
    det = [r[9] for r in rows]
    return {
        "a_at": rows[0][0], "a_lat": rows[0][7], "a_ev": _array([r[1] for r in rows]),
        "a_seq": "{" + ",".join([str(r[2]) for r in rows]) + "}", "a_stream": _array([r[4] for r in rows]),
        "a_n": "{" + ",".join([str(r[5]) for r in rows]) + "}",
        "a_out": out if any(o != "delivered" for o in out) else [],
        "a_err": err if any(err) else [], "a_det": det if any(det) else [],
    }, trim  # fmt: skip


_UNSAFE = re.compile(r'[\s{}"\\]')


def _array(values: list[str]) -> str | list[str]:
    """``values`` as the text form of a PostgreSQL array (``{a,b}``) when no element needs quoting
    (event ids and most stream names): the server reads that far faster than an ``ARRAY[...]``
    expression of a thousand literals; else the list itself (quoted element by element)."""
    joined = ",".join(values)
    if (
        joined.count(",") != len(values) - 1
        or _UNSAFE.search(joined)
        or ",," in f",{joined},"
        or ",NULL," in f",{joined.upper()},"
    ):
        return values
    return "{" + joined + "}"


class PostgresAttemptsMixin(PostgresParts):
    """Writes, reads and prunes ``<prefix>attempts``; ``retry_event`` for ``outrelay retry``."""

    #: ``[attempts] keep_per_event``: older attempts of an (event, destination) go when a newer one is written
    attempts_keep: int | None = None

    def _attempts_statement(self) -> Statement:
        """The insert as a statement of the settle script (built once)."""
        built: Statement | None = getattr(self, "_attempts_stmt", None)
        if built is None:
            built = statement("outrelay_attempts", _INSERT.format(t=self.n.attempts))
            self._attempts_stmt = built
        return built

    def _log_attempts(self, cur: Cursor, destination: str, logged: tuple[dict[str, Any], list[int]]) -> None:
        """Insert the attempts of ``logged`` (:func:`attempt_args`) in the caller's transaction,
        after trimming the events past ``keep_per_event``."""
        args, trim = logged
        keep, t = self.attempts_keep or 1, self.n.attempts
        for seq in trim:  # only when keep_per_event is set
            cur.execute(
                f"DELETE FROM {t} WHERE event_seq = %s AND destination = %s AND id NOT IN "
                f"(SELECT id FROM {t} WHERE event_seq = %s AND destination = %s ORDER BY id DESC LIMIT %s)",
                (seq, destination, seq, destination, keep - 1),
            )
        cur.execute(_INSERT.format(t=t), {**args, "dest": destination})

    def attempts(
        self,
        *,
        event_id: str | None = None,
        stream: str | None = None,
        destination: str | None = None,
        since: float | None = None,
        limit: int = 100,
    ) -> list[tuple[Any, ...]]:
        """Logged attempts matching every filter given, newest first, at most ``limit`` (the
        columns of :meth:`~outrelay.core.stores.sqlite_attempts.SQLiteAttemptsMixin.attempts`)."""
        seq = None
        if event_id is not None:  # by the indexed sequence; an event pruned from the log: by id (a scan)
            found = self._q(f"SELECT seq FROM {self.n.events} WHERE id = %s", (event_id,))
            seq = int(found[0][0]) if found else None
        where, args = _filters(event_id, stream, destination, since, "%s", seq=seq)
        sql = f"SELECT {_COLS} FROM {self.n.attempts}{where} ORDER BY id DESC LIMIT %s"
        return [tuple(r) for r in self._q(sql, (*args, limit))]

    def prune_attempts(self, older_than: float, *, batch: int = 1000) -> int:
        """Delete up to ``batch`` of the oldest attempts logged before ``older_than``; returns the count."""
        t = self.n.attempts

        def fn(cur: Cursor) -> int:
            cur.execute(
                f"DELETE FROM {t} WHERE id IN (SELECT id FROM {t} ORDER BY id LIMIT %s) AND at < %s",
                (batch, older_than),
            )
            return int(cur.rowcount)

        return self._run(fn)

    def retry_event(
        self, event_id: str, *, destination: str | None, redeliver: bool, now: float
    ) -> list[tuple[str, str]]:
        """Send event ``event_id`` again now (see :func:`outrelay.core.relay.attempts.retry_event`).

        :raises NotFoundError: no such event."""
        n = self.n

        def fn(cur: Cursor) -> list[tuple[str, str]]:
            row = cur.execute(f"SELECT seq, stream FROM {n.events} WHERE id = %s", (event_id,)).fetchone()
            if row is None:
                raise NotFoundError(f"no event with id {event_id!r} in the outbox")
            seq, stream = int(row[0]), str(row[1])
            dests = {r[0] for r in cur.execute(f"SELECT destination FROM {n.deliveries} WHERE event_seq = %s", (seq,))}
            dead = cur.execute(
                f"SELECT id, destination, state, delivery_id FROM {n.dead_letters} "
                "WHERE event_seq = %s AND state IN ('dead', 'parked') ORDER BY id",
                (seq,),
            ).fetchall()
            wanted = {d for d in dests | {r[1] for r in dead} if destination is None or d == destination}
            if not wanted and redeliver and destination is not None:
                wanted = {destination}
            self._lock_lanes(cur, {(d, stream) for d in wanted})
            out: list[tuple[str, str]] = []
            for dest in sorted(dests & wanted):
                lane = cur.execute(
                    f"SELECT parked, owner FROM {n.lanes} WHERE destination = %s AND stream = %s", (dest, stream)
                ).fetchone()
                if lane is not None and lane[0]:
                    continue
                cur.execute(
                    f"UPDATE {n.lanes} SET due_at = %s WHERE destination = %s AND stream = %s AND owner IS NULL",
                    (now, dest, stream),
                )
                out.append((dest, "due now" if lane is None or lane[1] is None else "in flight"))
            for dl_id, dest, state, delivery_id in dead:
                if dest not in wanted:
                    continue
                self._requeue_dead(cur, dl_id, dest, stream, seq, state, delivery_id, now)
                out.append((dest, f"{state} letter {dl_id} queued again"))
            if out or not redeliver:
                return out
            if destination is None:
                raise NotFoundError("--redeliver needs --destination (the event is pending nowhere)")
            self._enqueue(cur, destination, stream, seq, now)
            return [(destination, "queued again")]

        return self._run(fn)

    if TYPE_CHECKING:  # provided by OperatorMixin

        def _lock_lanes(self, cur: Cursor, keys: set[tuple[str, str]]) -> None: ...
        def _enqueue(self, cur: Cursor, dest: str, stream: str, seq: int, now: float) -> None: ...
        def _requeue_dead(
            self,
            cur: Cursor,
            dl_id: int,
            dest: str,
            stream: str,
            seq: int,
            state: str,
            delivery_id: int | None,
            now: float,
        ) -> None: ...
