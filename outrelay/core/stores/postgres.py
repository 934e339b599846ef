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
  deliveries of a stream in one order for every relay. Events are taken
  from the routing queue (``<prefix>unrouted``: sequence and stream, filled
  by a trigger on the events table, so any writer's rows are queued and no
  event row is rewritten when it is routed), never through a cursor, so a
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

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

import psycopg
import psycopg.errors

from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import StoreError
from outrelay.core.stores.base import InlineRefused, Store, inline_call, running_inline
from outrelay.core.stores.lanes import PostgresLanesMixin
from outrelay.core.stores.postgres_append import append_async, append_sync, map_append_error
from outrelay.core.stores.postgres_attempts import PostgresAttemptsMixin
from outrelay.core.stores.postgres_audit import PostgresAuditMixin
from outrelay.core.stores.postgres_history import HistoryMixin
from outrelay.core.stores.postgres_ops import OperatorMixin
from outrelay.core.stores.postgres_pool import ConnectionPool, Listener, LoopListener, parse_url, redact
from outrelay.core.stores.postgres_relay import RelayMixin
from outrelay.core.stores.postgres_schema import Names, apply_migrations, check_version, current_version
from outrelay.core.stores.postgres_schema import migration_sql as _migration_sql
from outrelay.core.stores.postgres_script import BEGIN_RELAXED, ScriptMixin

__all__ = ["PostgresStore"]

log = logging.getLogger(__name__)

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]
_TRANSIENT = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure, psycopg.errors.LockNotAvailable)


class PostgresStore(
    RelayMixin,
    ScriptMixin,
    HistoryMixin,
    OperatorMixin,
    PostgresLanesMixin,
    PostgresAuditMixin,
    PostgresAttemptsMixin,
    Store,
):
    """See the module docstring. Options (URL query or keyword): ``schema``,
    ``prefix``, ``pool_size`` (connections = relay store threads), ``notify``,
    ``migrate`` (create/upgrade tables on open; else only check the version).

    :raises StoreError: cannot connect, or the schema is missing/too new.
    :raises ConfigError: malformed URL or option.
    """

    multi_relay = True
    listens_in_loop = True  # see listen()
    #: the relay's hot path (see :meth:`call_inline`)
    inline_methods = frozenset({"route", "claim", "route_and_claim", "settle", "next_due"})
    #: a round trip with the server's work in it: a route and claim at a trickle takes about 1 ms on loopback
    inline_seconds = 0.003

    def __init__(self, url: str, **options: Any) -> None:
        self.url = url
        self._conninfo, opts = parse_url(url, options)
        self.where = redact(url.split("?", 1)[0])
        self.n = Names(opts["schema"], opts["prefix"])
        self.notify: bool = opts["notify"]
        self.max_workers = opts["pool_size"]
        self._listeners: list[Listener | LoopListener] = []
        self._local: list[Callable[[str], None]] = []  # listen() callbacks, called by this process's routing
        self._claims_full: dict[str, bool] = {}
        self._init_script()
        self._pool = ConnectionPool(self._conninfo, self.max_workers, self.where)
        #: versions the open applied (``outrelay migrate`` can report them)
        self.migrations_applied: list[int] = []
        try:
            if opts["migrate"]:
                self.migrations_applied = self.migrate()
            else:
                self._run(lambda cur: check_version(cur, self.n))
        except BaseException:
            self._pool.close()
            raise

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

    def call_inline(self, call: Callable[[], T]) -> T:
        """See :meth:`Store.call_inline`: ``call`` runs in the caller's thread on an idle pooled
        connection, blocking that thread for its round trips (one for each call of
        :attr:`inline_methods` on the relay's hot path: about what a store thread's hand-off and the
        wake-up back cost, without the two context switches; the relay sends a call that took longer
        than :attr:`inline_seconds` back to the store's threads). Refused, with nothing done, when every
        connection is in use or a new one would have to be made. Their lock waits are short: claims
        skip locked lanes, routing only tries its lock, a settle locks this relay's own lanes.
        A deadlock, a serialization failure or a dropped connection is not retried here (the
        retries sleep): it raises :class:`InlineRefused` and the store's thread runs the call again,
        as :meth:`_run` would (each of these calls is idempotent under retry)."""
        with inline_call():
            return call()

    def _run(
        self,
        fn: Callable[[Cursor], T],
        *,
        reconnect: bool = True,
        relaxed: bool = False,
        first: str = "",
        finish: Callable[[T], str] | None = None,
        single: bool = False,
        script: bool = False,
    ) -> T:
        """Run ``fn`` in one transaction; retry deadlocks/serialization failures,
        and once on a dropped connection (every relay-side call is idempotent
        under retry: a repeated settle finds its lanes released and skips).

        ``relaxed`` commits without waiting for the WAL flush
        (``synchronous_commit = off``): for the relay's bookkeeping a database
        crash can then only roll state back to an earlier consistent point,
        which means sending some events again — never losing one. Appends
        never run relaxed. A relaxed transaction also saves round trips, which
        the relay pays on every claim, route and settle: ``BEGIN``, the ``SET``
        and ``first`` (a statement without parameters; ``fn`` finds the cursor
        on its result) go in one message, and ``finish(result)`` (statements
        without parameters, or ``""``) in the one that commits.

        ``single``: ``fn`` runs one statement, on the autocommit connection as its own
        transaction (no ``BEGIN`` and ``COMMIT`` round trips): for a read that needs no
        snapshot beyond its statement's.

        ``script``: ``fn`` gets a client-side binding cursor on the autocommit
        connection and sends its whole transaction in one message (see
        :mod:`.postgres_script`).

        Any other call (a transaction that is not the relay's hot path: an
        operator's replay, an enable, a status read) forgets what
        :meth:`quiet_until` knew, since it may have made lanes due."""
        if not (relaxed or single or script):
            self.forget_quiet()
        attempt = 0
        while True:
            attempt += 1
            try:
                return self._once(fn, relaxed, first, finish, single, script)
            except psycopg.OperationalError as exc:  # _TRANSIENT's errors among them
                if running_inline():  # the store's thread retries it (see call_inline)
                    raise InlineRefused(f"PostgreSQL outbox {self.where}: {_line(exc)}") from None
                if isinstance(exc, _TRANSIENT):
                    if attempt >= 8:
                        raise StoreError(
                            f"PostgreSQL outbox {self.where}: {_line(exc)} (gave up after {attempt} tries)"
                        ) from None
                    time.sleep(random.uniform(0.001, 0.01 * attempt))
                elif not (reconnect and attempt == 1):
                    raise StoreError(f"PostgreSQL outbox {self.where}: {_line(exc)}") from None
            except psycopg.Error as exc:
                raise StoreError(f"PostgreSQL outbox {self.where}: {_line(exc)}") from None

    def _once(
        self,
        fn: Callable[[Cursor], T],
        relaxed: bool,
        first: str,
        finish: Callable[[T], str] | None,
        single: bool,
        script: bool,
    ) -> T:
        """One try of :meth:`_run`'s transaction, in the way its flags ask."""
        if script:
            return self._scripted(fn)
        if relaxed:
            return self._relaxed(fn, first, finish)
        if single:
            with self._pool.connection() as conn, conn.cursor() as cur:
                return fn(cur)
        with self._pool.connection() as conn, conn.transaction(), conn.cursor() as cur:
            return fn(cur)

    def _relaxed(self, fn: Callable[[Cursor], T], first: str, finish: Callable[[T], str] | None) -> T:
        """One relaxed transaction (see :meth:`_run`), begun and committed by hand on an autocommit connection.

        :raises psycopg.Error: from any statement; the transaction is rolled back
            (or the broken connection dropped by the pool).
        """
        with self._pool.connection() as conn, conn.cursor() as cur:
            cur.execute(f"{BEGIN_RELAXED}; {first}" if first else BEGIN_RELAXED)
            try:
                if first:
                    cur.nextset()  # past BEGIN
                    cur.nextset()  # past SET: on first's result
                result = fn(cur)
                tail = finish(result) if finish is not None else ""
                cur.execute(f"{tail}; COMMIT" if tail else "COMMIT")
                while cur.nextset():
                    pass
                if cur.statusmessage != "COMMIT":  # a failed statement fn let through: COMMIT rolled back
                    raise StoreError(f"PostgreSQL outbox {self.where}: the transaction was rolled back")
            except BaseException:
                if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise
            return result

    def _q(self, sql: str, args: Sequence[Any] | dict[str, Any] = (), *, single: bool = False) -> list[Any]:
        """The rows of ``sql`` in a transaction of its own (``single``: see :meth:`_run`)."""

        def fn(cur: Cursor) -> list[Any]:
            cur.execute(sql, args)
            return cur.fetchall()

        return self._run(fn, single=single)

    @staticmethod
    def _event(seq: int, attrs: Any, data: bytes) -> Event:
        return Event.from_attributes(attrs, data, seq)

    # -- application side ---------------------------------------------------------

    def append(self, events: Sequence[Event], conn: Any = None) -> list[Event]:
        with self._append_errors():
            if conn is not None:
                return append_sync(conn, events, self.n, self.notify)
            with self._pool.connection() as own, own.transaction():
                return append_sync(own, events, self.n, self.notify)

    async def aappend(self, events: Sequence[Event], conn: Any = None) -> list[Event]:
        """Append through an async connection (``psycopg.AsyncConnection``,
        SQLAlchemy ``AsyncSession``/``AsyncConnection``) in its transaction."""
        if conn is None:
            return await super().aappend(events)
        with self._append_errors():
            return await append_async(conn, events, self.n, self.notify)

    @contextlib.contextmanager
    def _append_errors(self) -> Iterator[None]:
        """Around an append: a database error (psycopg's, or a driver's that wraps one, such as
        SQLAlchemy's) is raised as the outrelay error :func:`map_append_error` gives; a
        :class:`StoreError` and any other exception pass through unchanged."""
        try:
            yield
        except StoreError:
            raise
        except Exception as exc:
            if isinstance(exc, psycopg.Error) or _is_db_error(exc):
                raise map_append_error(exc, self.n, self.where) from None
            raise

    def listen(
        self, callback: Callable[[str], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> Callable[[], None]:
        """Call ``callback("appended" | "routed")`` from a thread when another
        process commits an append or routes events; returns the stop function.
        With ``loop`` (the caller's running event loop), the LISTEN connection is a
        reader of that loop instead, and ``callback`` is called in the loop's thread
        (no thread to wake and no hand-off per append); the stop function must then
        be called in that thread too.

        A ``routed`` this store's own routing sent is not passed on from the
        server: :meth:`route` calls the callbacks itself as it commits (one
        wake-up, at once; the late echo through the server would only send a
        relay's destinations into another claim that finds nothing)."""
        if not self.notify:
            return lambda: None
        pids = self._pool.pids

        def heard(payload: str, pid: int) -> None:
            if payload != "routed" or pid not in pids:
                if payload == "routed":
                    self.forget_quiet()  # before the wake-up: the woken worker must claim
                callback(payload)

        listener: Listener | LoopListener = (
            Listener(self._conninfo, self.n.channel, heard, self.where)
            if loop is None
            else LoopListener(self._conninfo, self.n.channel, heard, self.where, loop)
        )
        self._listeners.append(listener)
        self._local.append(callback)

        def stop() -> None:
            listener.stop()
            if listener in self._listeners:
                self._listeners.remove(listener)
            if callback in self._local:
                self._local.remove(callback)

        return stop

    def _routed_here(self) -> None:
        """This store's routing committed deliveries: wake this process's listeners (see :meth:`listen`)."""
        for callback in list(self._local):
            try:
                callback("routed")
            except Exception:  # a wake-up is a hint: never let it fail the route
                log.debug("routed callback failed", exc_info=True)

    def close(self) -> None:
        for listener in list(self._listeners):
            listener.stop()
        self._listeners.clear()
        self._local.clear()
        self._pool.close()

    def __repr__(self) -> str:
        return f"<PostgresStore {self.where} {self.n.schema_name}.{self.n.prefix}*>"


def _line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _is_db_error(exc: BaseException) -> bool:
    """A SQLAlchemy DBAPIError (checked by name: SQLAlchemy is optional)."""
    return any(c.__name__ == "DBAPIError" and c.__module__.startswith("sqlalchemy") for c in type(exc).__mro__)
