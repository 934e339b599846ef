"""Consumer-side dead letters: events a subscriber's handler could not handle.

One table, ``outrelay_consumer_dead_letters``, in a SQLite or PostgreSQL
database (by default the outbox's own, so ``outrelay dlq`` finds it). Each
row keeps what WF-010 asks of a dead letter — the event (CloudEvents JSON,
or the raw bytes of a message that was not one), the consumer (group or
fan-out subscription name) and member, the failure reason, the attempt
count and timestamps — and a ``state``:

* ``dead`` — handled no further; the stream went on.
* ``parked`` — the head of a stream that waits for an operator (later
  events of that stream are held unacknowledged by the subscriber).
* ``queued`` (``queued-parked``) — an operator asked for a replay
  (``outrelay dlq replay --consumer``); a running member of that consumer
  takes it (``replaying``/``replaying-parked``) and hands it to the
  handler again, then marks it ``replayed`` — or ``dead``/``parked`` again
  if it still fails. A parked stream stays held until its head is
  ``replayed`` or purged.

The table is created on first use, independently of the outbox schema
(consumers may run against another database than the producer's outbox).
Every database failure is raised as :class:`~outrelay.StoreError`.
"""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from outrelay.core.model.errors import ConfigError, NotFoundError, StoreError
from outrelay.core.stores._caller_tx import driver

__all__ = ["ConsumerDeadLetter", "ConsumerDeadLetters"]

_TABLE = "outrelay_consumer_dead_letters"
_COLUMNS = (
    "id, consumer, member, event_id, type, stream, tenant, body, content_type, reason, attempts, "
    "first_failed_at, failed_at, state"
)


@dataclasses.dataclass(frozen=True, slots=True)
class ConsumerDeadLetter:
    """One consumer dead letter. ``body`` is the structured CloudEvent (JSON)
    for an event, or the raw message bytes when it was not one (``type`` empty)."""

    id: int
    consumer: str
    member: str
    event_id: str
    type: str
    stream: str
    tenant: str | None
    body: bytes
    content_type: str | None
    reason: str
    attempts: int
    first_failed_at: float
    failed_at: float
    state: str

    def summary(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        del d["body"], d["content_type"]
        return d


@contextmanager
def _db_errors(message: Callable[[BaseException], str], also: tuple[type[Exception], ...] = ()) -> Iterator[None]:
    """Raise an error of the database drivers (sqlite3's, psycopg's) or of ``also`` in the block as
    ``StoreError(message(exc))`` (no chained cause: a driver's text may hold the URL); a
    StoreError and any other exception pass unchanged."""
    caught: tuple[type[Exception], ...] = (sqlite3.Error, *also)
    try:
        yield
    except caught as exc:
        raise StoreError(message(exc)) from None
    except StoreError:
        raise
    except Exception as exc:
        if driver(exc) == "psycopg":  # psycopg's errors, without importing it when unused
            raise StoreError(message(exc)) from None
        raise


class ConsumerDeadLetters:
    """The consumer dead-letter table in ``url`` (``sqlite:///FILE``,
    ``sqlite://:memory:`` or ``postgresql://...``). Thread-safe; blocking
    (the subscriber runtime calls it from a worker thread)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._lock = threading.Lock()
        self._pg = url.startswith(("postgresql:", "postgres:"))
        with _db_errors(lambda exc: f"consumer dead letters: cannot open {self._where()}: {exc}", also=(OSError,)):
            if self._pg:
                try:
                    import psycopg
                except ImportError:
                    raise ConfigError(
                        'consumer dead letters on PostgreSQL need psycopg: pip install "outrelay[postgres]"'
                    ) from None
                base = url.split("?", 1)[0]
                self._db: Any = psycopg.connect(base, autocommit=True)
                ddl = f"""CREATE TABLE IF NOT EXISTS {_TABLE} (
                    id BIGSERIAL PRIMARY KEY, consumer TEXT NOT NULL, member TEXT NOT NULL,
                    event_id TEXT NOT NULL, type TEXT NOT NULL, stream TEXT NOT NULL, tenant TEXT,
                    body BYTEA NOT NULL, content_type TEXT, reason TEXT NOT NULL, attempts INTEGER NOT NULL,
                    first_failed_at DOUBLE PRECISION NOT NULL, failed_at DOUBLE PRECISION NOT NULL,
                    state TEXT NOT NULL)"""
            else:
                path = url.removeprefix("sqlite:///").removeprefix("sqlite://") if url != "memory" else ":memory:"
                if not url.startswith("sqlite:") and url != "memory":
                    raise ConfigError(f"consumer dead letters: unsupported database url {url.split('@')[-1]!r}")
                self._db = sqlite3.connect(path or ":memory:", check_same_thread=False, isolation_level=None)
                self._db.execute("PRAGMA busy_timeout = 5000")
                ddl = f"""CREATE TABLE IF NOT EXISTS {_TABLE} (
                    id INTEGER PRIMARY KEY AUTOINCREMENT, consumer TEXT NOT NULL, member TEXT NOT NULL,
                    event_id TEXT NOT NULL, type TEXT NOT NULL, stream TEXT NOT NULL, tenant TEXT,
                    body BLOB NOT NULL, content_type TEXT, reason TEXT NOT NULL, attempts INTEGER NOT NULL,
                    first_failed_at REAL NOT NULL, failed_at REAL NOT NULL, state TEXT NOT NULL)"""
            with self._cursor() as cur:
                cur.execute(ddl)
                cur.execute(f"CREATE INDEX IF NOT EXISTS {_TABLE}_consumer ON {_TABLE} (consumer, state, id)")

    def _where(self) -> str:
        return self.url.split("@")[-1]

    @contextmanager
    def _cursor(self) -> Iterator[Any]:
        with self._lock, _db_errors(lambda exc: f"consumer dead letters ({self._where()}): {exc}"):
            cur = self._db.cursor()
            try:
                yield cur
            finally:
                cur.close()

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self._pg else sql

    def _rows(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._cursor() as cur:
            cur.execute(self._sql(sql), tuple(args))
            return list(cur.fetchall()) if cur.description else []

    # -- subscriber side ----------------------------------------------------

    def record(
        self,
        *,
        consumer: str,
        member: str,
        event_id: str,
        type: str,
        stream: str,
        tenant: str | None,
        body: bytes,
        content_type: str | None,
        reason: str,
        attempts: int,
        first_failed_at: float,
        failed_at: float,
        state: str = "dead",
    ) -> int:
        """Insert a dead letter; returns its id."""
        rows = self._rows(
            f"INSERT INTO {_TABLE} (consumer, member, event_id, type, stream, tenant, body, content_type, reason, "
            "attempts, first_failed_at, failed_at, state) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) RETURNING id",
            (consumer, member, event_id, type, stream, tenant, body, content_type, reason[:2000], attempts,
             first_failed_at, failed_at, state),
        )  # fmt: skip
        return int(rows[0][0])

    def parked_streams(self, consumer: str) -> set[str]:
        """Streams of ``consumer`` waiting for an operator: a ``parked`` head, also while it is being replayed."""
        rows = self._rows(
            f"SELECT DISTINCT stream FROM {_TABLE} WHERE consumer = ? "
            "AND state IN ('parked', 'queued-parked', 'replaying-parked')",
            (consumer,),
        )
        return {r[0] for r in rows}

    def take_queued(self, consumer: str, member: str, limit: int = 100) -> list[ConsumerDeadLetter]:
        """Atomically take replays an operator queued for ``consumer``: state ``replaying``
        (``replaying-parked`` for a parked head, whose stream stays parked until it succeeds)."""
        rows = self._rows(
            f"UPDATE {_TABLE} SET member = ?, state = CASE WHEN state = 'queued-parked' THEN 'replaying-parked' "
            f"ELSE 'replaying' END WHERE id IN (SELECT id FROM {_TABLE} "
            f"WHERE consumer = ? AND state IN ('queued', 'queued-parked') ORDER BY id LIMIT ?) RETURNING {_COLUMNS}",
            (member, consumer, limit),
        )
        return sorted((ConsumerDeadLetter(*r) for r in rows), key=lambda d: d.id)

    def finish(self, dl_id: int, *, state: str, reason: str | None = None, attempts: int | None = None,
               now: float) -> None:  # fmt: skip
        """Record the outcome of a replay (``replayed``, or ``dead``/``parked`` again)."""
        self._rows(
            f"UPDATE {_TABLE} SET state = ?, reason = COALESCE(?, reason), attempts = COALESCE(?, attempts), "
            "failed_at = ? WHERE id = ?",
            (state, reason, attempts, now, dl_id),
        )

    # -- operator side ------------------------------------------------------

    def entries(
        self, *, consumer: str | None = None, states: Sequence[str] = ("dead", "parked"), limit: int = 100
    ) -> list[ConsumerDeadLetter]:
        marks = ", ".join("?" for _ in states)
        where = f"state IN ({marks})" + (" AND consumer = ?" if consumer else "")
        args: list[Any] = [*states, *([consumer] if consumer else []), limit]
        rows = self._rows(f"SELECT {_COLUMNS} FROM {_TABLE} WHERE {where} ORDER BY id LIMIT ?", args)
        return [ConsumerDeadLetter(*r) for r in rows]

    def get(self, dl_id: int) -> ConsumerDeadLetter:
        """:raises NotFoundError: no such consumer dead letter."""
        rows = self._rows(f"SELECT {_COLUMNS} FROM {_TABLE} WHERE id = ?", (dl_id,))
        if not rows:
            raise NotFoundError(f"no consumer dead letter with id {dl_id} (see `outrelay dlq list --consumer all`)")
        return ConsumerDeadLetter(*rows[0])

    def _select(self, ids: Sequence[int] | None, consumer: str | None, states: Sequence[str]) -> tuple[str, list[Any]]:
        marks = ", ".join("?" for _ in states)
        where, args = f"state IN ({marks})", list[Any](states)
        if consumer:
            where += " AND consumer = ?"
            args.append(consumer)
        if ids is not None:
            where += f" AND id IN ({', '.join('?' for _ in ids) or 'NULL'})"
            args.extend(ids)
        return where, args

    def replay(self, ids: Sequence[int] | None, *, consumer: str | None) -> int:
        """Queue dead (and parked) letters for a running member to handle again. Returns the count."""
        where, args = self._select(ids, consumer, ("dead", "parked"))
        rows = self._rows(
            f"UPDATE {_TABLE} SET state = CASE WHEN state = 'parked' THEN 'queued-parked' ELSE 'queued' END "
            f"WHERE {where} RETURNING id",
            args,
        )
        return len(rows)

    def purge(self, ids: Sequence[int] | None, *, consumer: str | None) -> int:
        """Delete dead letters (a purged parked head releases its stream). Returns the count."""
        where, args = self._select(ids, consumer, ("dead", "parked", "replayed"))
        return len(self._rows(f"DELETE FROM {_TABLE} WHERE {where} RETURNING id", args))

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __repr__(self) -> str:
        return f"<ConsumerDeadLetters {self._where()!r}>"
