"""The PostgreSQL outbox (``postgresql://user@host/db?schema=app&prefix=outrelay_``).

Same data model and semantics as the SQLite store (see
:mod:`outrelay.core.stores.base`), for any number of relay processes:

* **Claiming** locks due lanes with ``FOR UPDATE SKIP LOCKED`` and leases them
  (``due_at`` = now + lease, ``owner`` = relay), so relays never share a lane
  and a crashed relay's lanes are claimable once its lease runs out. Settling
  first re-locks the lanes still leased by the caller; the outcomes for a lane
  another relay has taken over are dropped (that relay sends them again:
  at least once), so a late relay can never corrupt a lane's counters.
* **Routing** is serialised by a transaction-scoped advisory lock: one relay
  routes at a time, the others skip (``route`` returns 0), which keeps the
  deliveries of a stream in one order for every relay. Events are found
  through the ``NOT routed`` partial index, never through a cursor, so a
  transaction that took a lower ``seq`` and commits late is still routed
  (invariant 5); its event then follows, within its stream, the events
  routed before it became visible (delivery order is visibility order).
* **Appends** (see :mod:`.postgres_append`) run in the caller's transaction
  and ``NOTIFY`` the channel ``"<schema>.<prefix>events"`` (payload
  ``appended``), delivered on commit; routing notifies ``routed``.
  :meth:`PostgresStore.listen` turns these into relay wake-ups; polling
  remains the fallback.
* Lane rows are always locked in (destination, stream) order and deadlocks
  or serialization failures are retried, so concurrent relays do not fail.

Every database failure is raised as :class:`~outrelay.StoreError`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors

from outrelay.core.envelope import Event
from outrelay.core.errors import StoreError
from outrelay.core.stores.base import Claimed, Settlement, Store
from outrelay.core.stores.postgres_append import append_async, append_sync, map_append_error
from outrelay.core.stores.postgres_ops import OperatorMixin
from outrelay.core.stores.postgres_pool import ConnectionPool, Listener, parse_url, redact
from outrelay.core.stores.postgres_schema import Names, apply_migrations, check_version, current_version
from outrelay.core.stores.postgres_schema import migration_sql as _migration_sql

__all__ = ["PostgresStore"]

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]
_TRANSIENT = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure, psycopg.errors.LockNotAvailable)


class PostgresStore(OperatorMixin, Store):
    """See the module docstring. Options (URL query or keyword): ``schema``,
    ``prefix``, ``pool_size`` (connections = relay store threads), ``notify``,
    ``migrate`` (create/upgrade tables on open; else only check the version).

    :raises StoreError: cannot connect, or the schema is missing/too new.
    :raises ConfigError: malformed URL or option.
    """

    multi_relay = True

    def __init__(self, url: str, **options: Any) -> None:
        self.url = url
        self._conninfo, opts = parse_url(url, options)
        self.where = redact(url.split("?", 1)[0])
        self.n = Names(opts["schema"], opts["prefix"])
        self.notify: bool = opts["notify"]
        self.max_workers = opts["pool_size"]
        self._listeners: list[Listener] = []
        self._pool = ConnectionPool(self._conninfo, self.max_workers, self.where)
        if opts["migrate"]:
            self.migrate()
        else:
            self._run(lambda cur: check_version(cur, self.n))

    # -- schema -------------------------------------------------------------------

    @staticmethod
    def migration_sql(schema: str = "public", prefix: str = "outrelay_", *, from_version: int = 0) -> str:
        """The SQL script (one transaction) that creates/upgrades the outbox
        tables from ``from_version`` (0 = nothing yet) to the latest."""
        return _migration_sql(schema, prefix, from_version=from_version)

    def migrate(self) -> list[int]:
        """Apply pending migrations (idempotent, safe with concurrent openers);
        returns the versions applied (empty when up to date)."""
        with self._pool.connection() as conn:
            try:
                return apply_migrations(conn, self.n)
            except psycopg.Error as exc:
                raise StoreError(f"cannot migrate the PostgreSQL outbox {self.where}: {_line(exc)}") from None

    def schema_version(self) -> int:
        """The version recorded in ``<prefix>migrations`` (0: no outbox tables)."""
        return self._run(lambda cur: current_version(cur, self.n))

    # -- plumbing -----------------------------------------------------------------

    def _run(self, fn: Callable[[Cursor], T], *, reconnect: bool = True) -> T:
        """Run ``fn`` in one transaction; retry deadlocks/serialization failures,
        and once on a dropped connection (every relay-side call is idempotent
        under retry: a repeated settle finds its lanes released and skips)."""
        attempt = 0
        while True:
            attempt += 1
            try:
                with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
                    return fn(cur)
            except _TRANSIENT as exc:
                if attempt >= 8:
                    raise StoreError(
                        f"PostgreSQL outbox {self.where}: {_line(exc)} (gave up after {attempt} tries)"
                    ) from None
                time.sleep(random.uniform(0.001, 0.01 * attempt))
            except psycopg.OperationalError as exc:
                if not (reconnect and attempt == 1):
                    raise StoreError(f"PostgreSQL outbox {self.where}: {_line(exc)}") from None
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL outbox {self.where}: {_line(exc)}") from None

    def _q(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        def fn(cur: Cursor) -> list[Any]:
            cur.execute(sql, args)
            return cur.fetchall()

        return self._run(fn)

    @staticmethod
    def _event(seq: int, attrs: Any, data: bytes) -> Event:
        return Event.from_attributes(attrs, data, seq)

    # -- application side ---------------------------------------------------------

    def append(self, events: Sequence[Event], conn: Any = None) -> list[Event]:
        try:
            if conn is not None:
                return append_sync(conn, events, self.n, self.notify)
            with self._pool.connection() as own, own.transaction():
                return append_sync(own, events, self.n, self.notify)
        except StoreError:
            raise
        except Exception as exc:
            if isinstance(exc, psycopg.Error) or _is_db_error(exc):
                raise map_append_error(exc, self.n, self.where) from None
            raise

    async def aappend(self, events: Sequence[Event], conn: Any = None) -> list[Event]:
        """Append through an async connection (``psycopg.AsyncConnection``,
        SQLAlchemy ``AsyncSession``/``AsyncConnection``) in its transaction."""
        if conn is None:
            return await super().aappend(events)
        try:
            return await append_async(conn, events, self.n, self.notify)
        except StoreError:
            raise
        except Exception as exc:
            if isinstance(exc, psycopg.Error) or _is_db_error(exc):
                raise map_append_error(exc, self.n, self.where) from None
            raise

    def listen(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback("appended" | "routed")`` from a thread when another
        process commits an append or routes events; returns the stop function."""
        if not self.notify:
            return lambda: None
        listener = Listener(self._conninfo, self.n.channel, callback, self.where)
        self._listeners.append(listener)

        def stop() -> None:
            listener.stop()
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    # -- relay side ---------------------------------------------------------------

    def acquire_relay(self, owner: str) -> None:
        """Register the relay (several may run; nothing is locked exclusively)."""
        self._q(
            f"INSERT INTO {self.n.relays} (owner, started_at) VALUES (%s, %s) "
            "ON CONFLICT (owner) DO UPDATE SET started_at = excluded.started_at RETURNING owner",
            (owner, time.time()),
        )

    def release_relay(self, owner: str) -> None:
        def fn(cur: Cursor) -> None:
            cur.execute(f"UPDATE {self.n.lanes} SET owner = NULL, due_at = 0 WHERE owner = %s", (owner,))
            cur.execute(f"DELETE FROM {self.n.relays} WHERE owner = %s", (owner,))

        self._run(fn)

    def route(self, router: Callable[[Event], Sequence[str]], limit: int, now: float) -> int:
        n = self.n

        def fn(cur: Cursor) -> int:
            cur.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", (n.route_key,))
            if not cur.fetchone()[0]:  # type: ignore[index]
                return 0  # another relay is routing; it keeps the order
            static = getattr(router, "static_destinations", None)
            cols = "NULL, NULL" if static is not None else "attrs, data"  # no decoding when routes are static
            cur.execute(
                f"SELECT seq, stream, {cols} FROM {n.events} WHERE NOT routed ORDER BY seq LIMIT %s", (limit,)
            )
            rows = cur.fetchall()
            if not rows:
                return 0
            dests: list[str] = []
            streams: list[str] = []
            seqs: list[int] = []
            lanes: dict[tuple[str, str], int] = {}
            for seq, stream, attrs, data in rows:
                for dest in static if static is not None else router(self._event(seq, attrs, data)):
                    dests.append(dest)
                    streams.append(stream)
                    seqs.append(seq)
                    lanes[(dest, stream)] = lanes.get((dest, stream), 0) + 1
            if dests:
                cur.execute(
                    f"INSERT INTO {n.deliveries} (destination, stream, event_seq, created_at) "
                    "SELECT d, s, e, %s FROM unnest(%s::text[], %s::text[], %s::bigint[]) "
                    "WITH ORDINALITY AS u(d, s, e, o) ORDER BY o",
                    (now, dests, streams, seqs),
                )
                keys = sorted(lanes)  # lock lanes in one global order: no deadlock with settle
                cur.execute(
                    f"INSERT INTO {n.lanes} (destination, stream, due_at, pending) "
                    "SELECT d, s, %s, c FROM unnest(%s::text[], %s::text[], %s::int[]) "
                    "WITH ORDINALITY AS u(d, s, c, o) ORDER BY o ON CONFLICT (destination, stream) "
                    f"DO UPDATE SET pending = {n.lanes}.pending + excluded.pending",
                    (now, [k[0] for k in keys], [k[1] for k in keys], [lanes[k] for k in keys]),
                )
                if self.notify:
                    cur.execute("SELECT pg_notify(%s, 'routed')", (n.channel,))
            cur.execute(f"UPDATE {n.events} SET routed = true WHERE seq = ANY(%s)", ([r[0] for r in rows],))
            return len(rows)

        return self._run(fn)

    def claim(
        self, destination: str, *, limit: int, per_lane: int, owner: str, lease_seconds: float, now: float
    ) -> list[Claimed]:
        n = self.n

        def fn(cur: Cursor) -> list[Claimed]:
            cur.execute(
                f"SELECT stream FROM {n.lanes} WHERE destination = %s AND NOT parked AND due_at <= %s "
                "ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED",
                (destination, now, limit),
            )
            locked = [r[0] for r in cur.fetchall()]
            if not locked:
                return []
            cur.execute(
                "SELECT l.stream, d.id, d.attempts, d.first_attempt_at, e.seq, e.attrs, e.data "
                "FROM unnest(%s::text[]) WITH ORDINALITY AS l(stream, o) "
                "CROSS JOIN LATERAL (SELECT id, attempts, first_attempt_at, event_seq "
                f"  FROM {n.deliveries} WHERE destination = %s AND stream = l.stream ORDER BY id LIMIT %s) d "
                f"JOIN {n.events} e ON e.seq = d.event_seq ORDER BY l.o, d.id LIMIT %s",
                (locked, destination, per_lane, limit),
            )
            rows = cur.fetchall()
            leased = list(dict.fromkeys(r[0] for r in rows))
            if leased:
                cur.execute(
                    f"UPDATE {n.lanes} SET owner = %s, due_at = %s WHERE destination = %s AND stream = ANY(%s)",
                    (owner, now + lease_seconds, destination, leased),
                )
            if len(rows) < limit and len(leased) < len(locked):
                # a lane whose deliveries are gone (counter drift) would be "due" forever
                cur.execute(
                    f"DELETE FROM {n.lanes} l WHERE destination = %s AND stream = ANY(%s) AND NOT EXISTS "
                    f"(SELECT 1 FROM {n.deliveries} d WHERE d.destination = l.destination AND d.stream = l.stream)",
                    (destination, [s for s in locked if s not in set(leased)]),
                )
            return [Claimed(r[1], self._event(r[4], r[5], r[6]), r[2], r[3]) for r in rows]

        return self._run(fn)

    def settle(self, destination: str, owner: str, settlements: Sequence[Settlement], now: float) -> None:
        if not settlements:
            return
        n = self.n

        def fn(cur: Cursor) -> None:
            cur.execute(
                f"SELECT stream FROM {n.lanes} WHERE destination = %s AND stream = ANY(%s) AND owner = %s "
                "ORDER BY stream FOR UPDATE",
                (destination, sorted({s.stream for s in settlements}), owner),
            )
            owned = {r[0] for r in cur.fetchall()}
            mine = [s for s in settlements if s.stream in owned]  # others: lease lost, the new owner resends
            lanes = {stream: [now, False, 0] for stream in owned}  # due_at, parked, removed
            gone: list[int] = []
            for s in mine:
                lane = lanes[s.stream]
                if s.kind == "delivered":
                    gone.append(s.delivery_id)
                elif s.kind == "retry":
                    cur.execute(
                        f"UPDATE {n.deliveries} SET attempts = %s, last_error = %s, "
                        "first_attempt_at = COALESCE(first_attempt_at, %s) WHERE id = %s",
                        (s.attempts, s.error, now, s.delivery_id),
                    )
                    lane[0] = max(lane[0], s.due_at)
                elif s.kind in ("dead", "park"):
                    cur.execute(
                        f"INSERT INTO {n.dead_letters} (event_seq, destination, stream, reason, attempts, "
                        "first_attempt_at, failed_at, state, delivery_id) "
                        "SELECT event_seq, %s, %s, %s, %s, COALESCE(first_attempt_at, %s), %s, %s, %s "
                        f"FROM {n.deliveries} WHERE id = %s",
                        (destination, s.stream, s.error or "", s.attempts, now, now,
                         "dead" if s.kind == "dead" else "parked",
                         s.delivery_id if s.kind == "park" else None, s.delivery_id),
                    )
                    if s.kind == "dead":
                        gone.append(s.delivery_id)
                    else:
                        cur.execute(
                            f"UPDATE {n.deliveries} SET attempts = %s, last_error = %s WHERE id = %s",
                            (s.attempts, s.error, s.delivery_id),
                        )
                        lane[1] = True
            if gone:
                cur.execute(f"DELETE FROM {n.deliveries} WHERE id = ANY(%s) RETURNING stream", (gone,))
                for (stream,) in cur.fetchall():
                    lanes[stream][2] += 1
            for stream in sorted(lanes):
                due, parked, removed = lanes[stream]
                cur.execute(
                    f"UPDATE {n.lanes} SET pending = pending - %s, owner = NULL, due_at = %s, parked = %s "
                    "WHERE destination = %s AND stream = %s",
                    (removed, due, parked, destination, stream),
                )
            if lanes:
                cur.execute(
                    f"DELETE FROM {n.lanes} WHERE destination = %s AND stream = ANY(%s) AND pending <= 0",
                    (destination, sorted(lanes)),
                )
            delivered = sum(1 for s in mine if s.kind == "delivered")
            if delivered:
                cur.execute(
                    f"INSERT INTO {n.destinations} (destination, delivered) VALUES (%s, %s) ON CONFLICT (destination) "
                    f"DO UPDATE SET delivered = {n.destinations}.delivered + excluded.delivered",
                    (destination, delivered),
                )

        self._run(fn)

    def next_due(self, destination: str) -> float | None:
        row = self._q(f"SELECT MIN(due_at) FROM {self.n.lanes} WHERE destination = %s AND NOT parked", (destination,))
        return None if row[0][0] is None else float(row[0][0])

    def unrouted(self) -> int:
        return int(self._q(f"SELECT COUNT(*) FROM {self.n.events} WHERE NOT routed")[0][0])

    def close(self) -> None:
        for listener in list(self._listeners):
            listener.stop()
        self._listeners.clear()
        self._pool.close()

    def __repr__(self) -> str:
        return f"<PostgresStore {self.where} {self.n.schema_name}.{self.n.prefix}*>"


def _line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _is_db_error(exc: BaseException) -> bool:
    """A SQLAlchemy DBAPIError (checked by name: SQLAlchemy is optional)."""
    return any(c.__name__ == "DBAPIError" and c.__module__.startswith("sqlalchemy") for c in type(exc).__mro__)

