"""One-message transactions for the PostgreSQL relay's hot path, and what the
relay knows is not due.

A relay cycle at a trickle of appends (route and claim, then settle) used to
cost about eleven statements, each a round trip and a hand-off between a store
thread and the event loop. :meth:`ScriptMixin._script` sends a whole relaxed
transaction as ONE simple-query message: ``BEGIN``, the ``SET``, the
statements and ``COMMIT``. Its statements are prepared once per connection
(``PREPARE``, in a message of its own the first time), so the message carries
``EXECUTE name(literal, ...)`` lines of a few hundred bytes and the server
neither parses nor plans them again.

A statement that needs an earlier one's result reads it from the server: the
earlier one keeps it with ``set_config(name, value, true)`` (gone when the
transaction ends), the later one reads ``current_setting(name)``. Each
statement still runs in a snapshot taken when it starts, as it would in a
message of its own, so the claim and settle keep their "lock, then read in a
snapshot that sees every commit before the lock" design.

Results come back in the text format, which is cheap for the few events a
trickle brings; a claim that came back full uses the binary path
(:meth:`RelayMixin.claim`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
import psycopg.errors
from psycopg import sql

if TYPE_CHECKING:
    Cursor = psycopg.Cursor[Any]

__all__ = ["ScriptMixin", "Statement", "statement"]

T = TypeVar("T")

BEGIN_RELAXED = "BEGIN; SET LOCAL synchronous_commit = off"
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK

#: the type of every parameter a script statement may name
_TYPES = {
    "rlim": "bigint", "dests": "text[]", "now": "float8", "dest": "text", "owner": "text", "lim": "bigint",
    "per_lane": "bigint", "until": "float8", "budget": "bigint", "streams": "text[]", "due": "float8[]",
    "parked": "bool[]", "gone": "bigint[]", "ok": "bool[]", "gone_streams": "text[]",
    "a_at": "float8", "a_ev": "text[]", "a_seq": "bigint[]", "a_stream": "text[]", "a_n": "integer[]",
    "a_out": "text[]", "a_lat": "float8", "a_err": "text[]", "a_det": "text[]",
}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Statement:
    """A statement of a script: ``prepare`` creates it on a connection, ``params`` name its arguments."""

    name: str
    params: tuple[str, ...]
    prepare: str


def statement(name: str, template: str) -> Statement:
    """A :class:`Statement` named ``name`` from ``template`` with ``%(param)s`` placeholders
    (each param's type from :data:`_TYPES`).

    :raises KeyError: a parameter without a known type (a bug)."""
    params: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in params:
            params.append(match.group(1))
        return f"${params.index(match.group(1)) + 1}"

    text = re.sub(r"%\((\w+)\)s", number, template)
    types = f" ({', '.join(_TYPES[p] for p in params)})" if params else ""
    return Statement(name, tuple(params), f"PREPARE {name}{types} AS {text}")


class ScriptMixin:
    """For :class:`~outrelay.core.stores.postgres.PostgresStore`: needs ``_pool``, ``_run`` and ``where``."""

    where: str
    _pool: Any

    if TYPE_CHECKING:

        def _run(self, fn: Callable[[Cursor], T], *, script: bool = False) -> T: ...

    def _init_script(self) -> None:
        #: per connection: the names of the statements prepared on it
        self._prepared: weakref.WeakKeyDictionary[Any, set[str]] = weakref.WeakKeyDictionary()
        #: per destination: (time before which nothing is due for this relay, when that was read)
        self._quiet: dict[str, tuple[float, float]] = {}
        self._quiet_version = 0  # bumped by every forget_quiet: a claim read before it must not store its hint
        self._quiet_lock = threading.Lock()  # store threads and the listener's thread change them

    def _scripted(self, fn: Callable[[Cursor], T]) -> T:
        """``fn(cur)`` with a client-side binding cursor on an autocommit connection; a transaction
        it left open (a failed statement) is rolled back."""
        with self._pool.connection() as conn, psycopg.ClientCursor(conn) as cur:
            try:
                return fn(cur)
            except BaseException:
                if not conn.broken and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
                    with contextlib.suppress(psycopg.Error):
                        conn.execute("ROLLBACK")
                raise

    def _script(self, statements: Sequence[Statement], args: dict[str, Any]) -> list[list[Any]]:
        """Run ``statements`` as one relaxed transaction sent in one message (see the module
        docstring): one round trip and one thread hand-off. Returns the rows of each statement that
        returns rows, in order.

        :raises psycopg.Error: from any statement (nothing of it is committed).
        :raises StoreError: the transaction was rolled back."""

        def fn(cur: Cursor) -> list[list[Any]]:
            self._prepare(cur, statements)
            values = _literals(cur.connection, args)  # each value quoted once, however often it is named
            calls = [f"EXECUTE {s.name}({', '.join(values[p] for p in s.params)})" for s in statements]
            text = f"{BEGIN_RELAXED}; {'; '.join(calls)}; COMMIT"
            try:
                cur.execute(text)
            except psycopg.errors.InvalidSqlStatementName:  # deallocated behind our back: prepare again
                cur.connection.execute("ROLLBACK")
                self._read_prepared(cur)
                self._prepare(cur, statements)
                cur.execute(text)
            out: list[list[Any]] = []
            while True:
                if cur.pgresult is not None and cur.pgresult.status == _TUPLES_OK:
                    out.append(cur.fetchall())
                if not cur.nextset():
                    break
            if cur.statusmessage != "COMMIT":
                from outrelay.core.model.errors import StoreError

                raise StoreError(f"PostgreSQL outbox {self.where}: the transaction was rolled back")
            return out

        return self._run(fn, script=True)

    def _prepare(self, cur: Cursor, statements: Sequence[Statement]) -> None:
        """Prepare those of ``statements`` not prepared on this connection yet (one message; none
        needed after the first time). A prepared statement outlives a failed message, so after a
        failure the connection's list is read back from the server and the rest prepared.

        :raises psycopg.Error: the statements cannot be prepared."""
        have = self._prepared.setdefault(cur.connection, set())
        for attempt in (1, 2):
            missing = [s for s in statements if s.name not in have]
            if not missing:
                return
            try:
                cur.execute("; ".join(s.prepare for s in missing))
                have.update(s.name for s in missing)
                return
            except psycopg.Error:
                if attempt == 2 or cur.connection.broken:
                    raise
                self._read_prepared(cur)

    def _read_prepared(self, cur: Cursor) -> set[str]:
        """The names of the statements prepared on ``cur``'s connection, as the server knows them."""
        have = self._prepared.setdefault(cur.connection, set())
        have.clear()
        have.update(r[0] for r in cur.execute("SELECT name FROM pg_prepared_statements").fetchall())
        return have

    # -- what this relay knows is not due (saves a claim's round trip) ---------

    def quiet_until(self, destination: str, ttl: float) -> float:
        """See :meth:`Store.quiet_until`: known from this relay's last claim of
        ``destination`` that was not full (the earliest ``due_at`` of the lanes
        it did not hold then), lowered by its settles that kept lanes pending,
        forgotten when this process routes or hears that another one routed,
        and trusted for ``ttl`` seconds at most (other relays' settles and
        lease expiries are not announced)."""
        known = self._quiet.get(destination)
        return 0.0 if known is None else min(known[0], known[1] + ttl)

    def forget_quiet(self) -> None:
        """Lanes may have become due (a routing, another relay's notice, an operator's write)."""
        with self._quiet_lock:
            self._quiet_version += 1
            self._quiet.clear()

    def _know_quiet(self, destination: str, version: int, due: float | None, read_at: float) -> None:
        """Remember that no lane of ``destination`` is due before ``due`` (None: none at all), as read
        at ``read_at`` — unless something forgot the hints since ``version`` was taken."""
        with self._quiet_lock:
            if version == self._quiet_version:
                self._quiet[destination] = (float("inf") if due is None else due, read_at)

    def _lower_quiet(self, destination: str, due: float) -> None:
        """A lane of ``destination`` is due at ``due`` (a settle kept it pending)."""
        with self._quiet_lock:
            known = self._quiet.get(destination)
            if known is not None and due < known[0]:
                self._quiet[destination] = (due, known[1])


def _literals(conn: psycopg.Connection[Any], args: dict[str, Any]) -> dict[str, str]:
    """``args`` as SQL literals: the types the relay's statements take (int, float, bool, str, None and
    lists of them) quoted here, anything else by psycopg (whose general path costs far more: a
    converter is built for each value)."""
    out = {}
    for name, value in args.items():
        text = _literal(value)
        out[name] = text if text is not None else sql.Literal(value).as_string(conn)
    return out


def _literal(value: Any) -> str | None:
    """``value`` as an SQL literal, or None when this function does not quote its type.

    Strings become ``E'...'`` literals with ``\\`` and ``'`` doubled, which reads the same whatever
    ``standard_conforming_strings`` says; a string holding NUL is left to psycopg (which refuses
    it: PostgreSQL text cannot hold it)."""
    kind = type(value)
    if isinstance(value, str) and kind is str:
        if "\x00" in value:
            return None
        return "E'" + value.replace("\\", "\\\\").replace("'", "''") + "'"
    if kind is int:
        return repr(value)
    if kind is float:
        return repr(value) if math.isfinite(value) else None
    if kind is bool:
        return "true" if value else "false"
    if value is None:
        return "NULL"
    if kind is list:
        items: list[str] = []
        for v in value:
            item = _literal(v)
            if item is None or item == "NULL":  # left to psycopg: a NULL element needs the array's type
                return None
            items.append(item)
        return f"ARRAY[{', '.join(items)}]" if items else "'{}'"
    return None
