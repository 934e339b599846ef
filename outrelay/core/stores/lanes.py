"""Operator view of lanes waiting for a retry, and "retry now" — for the SQLite and PostgreSQL stores.

A lane (one stream of one destination) whose head delivery failed waits until
its ``due_at`` (the backoff). :meth:`stuck_streams` lists such lanes with the
head's attempts, next attempt time and last error; :meth:`retry_now` moves
their ``due_at`` to now, so a running relay retries them at its next poll
(within ``relay.poll_interval``). Lanes a relay holds (sending now) and parked
lanes are not touched; parked ones wait for
an operator's ``outrelay dlq replay`` or ``purge``, and are reported through
:meth:`Store.dead_letters` (state ``parked``).

A store that lacks these methods (a third-party one) is detected with
:class:`LaneOperations`; the CLI then says the command is not supported.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from outrelay.core.stores.postgres_ops import PostgresParts
from outrelay.core.stores.sqlite_ops import SQLiteParts

if TYPE_CHECKING:
    import psycopg

    Cursor = psycopg.Cursor[Any]

__all__ = ["LaneOperations", "PostgresLanesMixin", "SQLiteLanesMixin", "StuckStream"]

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class StuckStream:
    """A lane waiting for its next attempt: its head delivery failed ``attempts`` times."""

    destination: str
    stream: str
    pending: int
    attempts: int
    next_attempt_at: float
    first_attempt_at: float | None
    last_error: str | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@runtime_checkable
class LaneOperations(Protocol):
    """What ``outrelay status`` and ``outrelay retry`` need from a store."""

    def stuck_streams(self, destination: str, *, limit: int = 20) -> list[StuckStream]: ...

    def retry_now(self, destination: str, *, stream: str | None, now: float) -> int: ...


_STUCK = (
    "SELECT l.stream, l.pending, d.attempts, l.due_at, d.first_attempt_at, d.last_error "
    "FROM {lanes} l JOIN {deliveries} d ON d.id = ("
    "  SELECT MIN(h.id) FROM {deliveries} h WHERE h.destination = l.destination AND h.stream = l.stream) "
    "WHERE l.destination = {p} AND {not_parked} AND l.owner IS NULL AND d.attempts > 0 "
    "ORDER BY l.due_at, l.stream LIMIT {p}"
)
# a leased lane's due_at is its lease expiry (a relay is sending it): never shortened
_RETRY = "UPDATE {lanes} SET due_at = {p} WHERE destination = {p} AND {not_parked} AND owner IS NULL AND due_at > {p}"


class SQLiteLanesMixin(SQLiteParts):
    """Needs ``_tx`` and ``_q`` from :class:`~outrelay.core.stores.sqlite.SQLiteStore`."""

    def stuck_streams(self, destination: str, *, limit: int = 20) -> list[StuckStream]:
        """Lanes of ``destination`` waiting for a retry, soonest first (at most ``limit``)."""
        sql = _STUCK.format(lanes="outrelay_lanes", deliveries="outrelay_deliveries", p="?", not_parked="l.parked = 0")
        return [StuckStream(destination, *row) for row in self._q(sql, (destination, limit))]

    def retry_now(self, destination: str, *, stream: str | None, now: float) -> int:
        """Make lanes of ``destination`` (one ``stream`` or all) that wait for backoff due at ``now``.
        Returns how many lanes changed."""
        sql = _RETRY.format(lanes="outrelay_lanes", p="?", not_parked="parked = 0")
        args: list[Any] = [now, destination, now]
        if stream is not None:
            sql += " AND stream = ?"
            args.append(stream)
        with self._tx() as db:
            return db.execute(sql, args).rowcount


class PostgresLanesMixin(PostgresParts):
    """Needs ``n`` (table names) and ``_run`` from :class:`~outrelay.core.stores.postgres.PostgresStore`."""

    def stuck_streams(self, destination: str, *, limit: int = 20) -> list[StuckStream]:
        """See :meth:`SQLiteLanesMixin.stuck_streams`."""
        sql = _STUCK.format(lanes=self.n.lanes, deliveries=self.n.deliveries, p="%s", not_parked="NOT l.parked")

        def fn(cur: Cursor) -> list[StuckStream]:
            cur.execute(sql, (destination, limit))
            return [StuckStream(destination, *row) for row in cur.fetchall()]

        return self._run(fn)

    def retry_now(self, destination: str, *, stream: str | None, now: float) -> int:
        """See :meth:`SQLiteLanesMixin.retry_now`."""
        sql = _RETRY.format(lanes=self.n.lanes, p="%s", not_parked="NOT parked")
        args: list[Any] = [now, destination, now]
        if stream is not None:
            sql += " AND stream = %s"
            args.append(stream)

        def fn(cur: Cursor) -> int:
            cur.execute(sql, args)
            return cur.rowcount

        return self._run(fn)
