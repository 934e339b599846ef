"""Appending to the PostgreSQL outbox inside the application's transaction.

One statement per chunk of events inserts them and (unless ``notify=false``)
calls ``pg_notify`` on the outbox channel: PostgreSQL delivers the
notification only when the transaction commits, so relays wake exactly when
the events become visible, and never for a rollback.

Accepted connections (the caller commits or rolls back):

* ``psycopg.Connection`` / ``psycopg.AsyncConnection`` (psycopg 3);
* SQLAlchemy 2.x ``Session`` / ``Connection`` and ``AsyncSession`` /
  ``AsyncConnection``, on any PostgreSQL driver (the statement goes through
  ``text()``, so it joins the session's transaction).

A duplicate event id raises :class:`~outrelay.EventError`; PostgreSQL then
marks the caller's transaction failed, so the caller must roll back.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson
import psycopg
from psycopg.rows import tuple_row

from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError, StoreError
from outrelay.core.stores._caller_tx import driver
from outrelay.core.stores.postgres_schema import Names

__all__ = ["append_async", "append_sync", "map_append_error"]

CHUNK = 1000
_COLS = 7


def _rows(events: Sequence[Event]) -> list[tuple[Any, ...]]:
    return [
        (e.id, e.stream, e.type, e.tenant, e.time.timestamp(), orjson.dumps(e.attributes()).decode(), e.data)
        for e in events
    ]


def _sql(n: Names, count: int, notify: bool, named: bool) -> str:
    if named:
        values = ", ".join(f"(:i{i}, :s{i}, :t{i}, :n{i}, :w{i}, CAST(:a{i} AS jsonb), :d{i})" for i in range(count))
        channel = ":channel"
    else:
        values = ", ".join(["(%s, %s, %s, %s, %s, %s::jsonb, %s)"] * count)
        channel = "%s"
    insert = f"INSERT INTO {n.events} (id, stream, type, tenant, time, attrs, data) VALUES {values} RETURNING id, seq"
    if not notify:
        return insert
    note = f"SELECT pg_notify({channel}, 'appended')"  # delivered by PostgreSQL on commit only
    return f"WITH ins AS ({insert}), note AS ({note}) SELECT ins.id, ins.seq FROM ins, note"


def _positional(rows: Sequence[tuple[Any, ...]], n: Names, notify: bool) -> list[Any]:
    args: list[Any] = [v for r in rows for v in r]
    if notify:
        args.append(n.channel)
    return args


def _named(rows: Sequence[tuple[Any, ...]], n: Names, notify: bool) -> dict[str, Any]:
    args: dict[str, Any] = {}
    for i, r in enumerate(rows):
        for key, value in zip("istnwad", r, strict=True):
            args[f"{key}{i}"] = value
    if notify:
        args["channel"] = n.channel
    return args


def _chunks(rows: list[tuple[Any, ...]]) -> list[list[tuple[Any, ...]]]:
    return [rows[i : i + CHUNK] for i in range(0, len(rows), CHUNK)]


def _with_seqs(events: Sequence[Event], pairs: dict[str, int]) -> list[Event]:
    return [e.replace(sequence=int(pairs[e.id])) for e in events]


def _statements(rows: list[tuple[Any, ...]], n: Names, notify: bool, *, sqlalchemy: bool) -> Iterator[tuple[Any, Any]]:
    """One ``(statement, parameters)`` per chunk of ``rows``: SQL with ``%s`` placeholders and a
    list, or (``sqlalchemy``) a ``text()`` clause and named parameters. Each returns ``(id, seq)``
    rows."""
    if sqlalchemy:
        from sqlalchemy import text

        for chunk in _chunks(rows):
            yield text(_sql(n, len(chunk), notify, named=True)), _named(chunk, n, notify)
    else:
        for chunk in _chunks(rows):
            yield _sql(n, len(chunk), notify, named=False), _positional(chunk, n, notify)


def _refused(conn: Any, method: str, takes: str, hint: str = "") -> StoreError:
    """The error for an append given a connection it cannot use."""
    return StoreError(f"{method}(conn=...) on a PostgreSQL outbox takes a {takes}, got {type(conn).__name__}{hint}")


def append_sync(conn: Any, events: Sequence[Event], n: Names, notify: bool) -> list[Event]:
    """Insert ``events`` through a sync psycopg connection or SQLAlchemy session/connection."""
    rows = _rows(events)
    pairs: dict[str, int] = {}
    if isinstance(conn, psycopg.Connection):
        with conn.cursor(row_factory=tuple_row) as cur:  # whatever row factory the application set
            for sql, args in _statements(rows, n, notify, sqlalchemy=False):
                cur.execute(sql, args)
                pairs.update(cur.fetchall())
    elif driver(conn) == "sqlalchemy" and hasattr(conn, "execute"):
        for stmt, params in _statements(rows, n, notify, sqlalchemy=True):
            pairs.update((r[0], r[1]) for r in conn.execute(stmt, params).all())
    else:
        takes = "psycopg.Connection or a SQLAlchemy Session/Connection"
        raise _refused(conn, "append", takes, " (async connections go to Outbox.aappend)")
    return _with_seqs(events, pairs)


async def append_async(conn: Any, events: Sequence[Event], n: Names, notify: bool) -> list[Event]:
    """Insert ``events`` through an async psycopg connection or SQLAlchemy AsyncSession/AsyncConnection."""
    rows = _rows(events)
    pairs: dict[str, int] = {}
    if isinstance(conn, psycopg.AsyncConnection):
        async with conn.cursor(row_factory=tuple_row) as cur:
            for sql, args in _statements(rows, n, notify, sqlalchemy=False):
                await cur.execute(sql, args)
                pairs.update(await cur.fetchall())
    elif driver(conn) == "sqlalchemy" and hasattr(conn, "execute"):
        for stmt, params in _statements(rows, n, notify, sqlalchemy=True):
            pairs.update((r[0], r[1]) for r in (await conn.execute(stmt, params)).all())
    else:
        raise _refused(conn, "aappend", "psycopg.AsyncConnection or a SQLAlchemy AsyncSession/AsyncConnection")
    return _with_seqs(events, pairs)


def map_append_error(exc: BaseException, n: Names, where: str) -> BaseException:
    """The outrelay error for a driver error raised by an append."""
    orig = getattr(exc, "orig", None) or exc  # SQLAlchemy wraps the driver's error
    state = getattr(orig, "sqlstate", None) or getattr(orig, "pgcode", None)
    if state == "23505" and "_id_key" in str(orig):
        return EventError(f"an event with one of these ids is already in the outbox: {_line(orig)}")
    if state in ("42P01", "3F000"):
        return StoreError(
            f"the connection passed to append() does not see the outbox tables {n.events} ({where}); "
            "is it on the outbox database, and was the outbox opened (migrated) once?"
        )
    return StoreError(f"PostgreSQL outbox {where}: append failed: {_line(orig)}")


def _line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]
