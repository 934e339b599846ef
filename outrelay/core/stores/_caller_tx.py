"""SQL on the caller's own connection, in the caller's transaction, whatever its driver.

The inbox (:mod:`outrelay.core.consumer.inbox`) and the PostgreSQL outbox's append
(:mod:`outrelay.core.stores.postgres_append`) take the application's
connection: ``sqlite3``, psycopg 3, or a SQLAlchemy ``Session`` /
``Connection`` (sync or async). :func:`driver` tells which by the class's
module (no driver is imported to find out); :func:`run` and :func:`arun` run
one statement written with ``%s`` placeholders on it. Nothing here commits or
rolls back: the statement joins whatever transaction the caller has open.
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["Driver", "arun", "driver", "named", "run"]

Driver = Literal["sqlite", "psycopg", "sqlalchemy"]

_DRIVERS: tuple[tuple[str, Driver], ...] = (("sqlite3", "sqlite"), ("psycopg", "psycopg"), ("sqlalchemy", "sqlalchemy"))


def driver(conn: Any) -> Driver | None:
    """Which driver ``conn`` belongs to (by its class's module name), None for any other object.
    Also tells a driver's exceptions apart (``driver(exc) == "psycopg"``) without importing it."""
    mod = type(conn).__module__
    for prefix, kind in _DRIVERS:
        if mod.startswith(prefix):
            return kind
    return None


def named(sql: str, args: tuple[Any, ...]) -> tuple[str, dict[str, Any]]:
    """``%s`` placeholders -> SQLAlchemy ``:p0, :p1`` named parameters."""
    parts = sql.split("%s")
    out = parts[0] + "".join(f":p{i}{rest}" for i, rest in enumerate(parts[1:]))
    return out, {f"p{i}": a for i, a in enumerate(args)}


def run(kind: Driver, conn: Any, sql: str, args: tuple[Any, ...], *, first: bool = False) -> Any:
    """Run ``sql`` (``%s`` placeholders) with ``args`` on the sync connection ``conn`` of driver
    ``kind``; returns the affected row count, or with ``first`` the first row of the result (None
    when there is none). Driver errors pass through unchanged."""
    if kind == "sqlite":
        cursor = conn.execute(sql.replace("%s", "?"), args)
        return cursor.fetchone() if first else int(cursor.rowcount)
    if kind == "psycopg":
        with conn.cursor() as cur:
            cur.execute(sql, args)
            return cur.fetchone() if first else int(cur.rowcount)
    from sqlalchemy import text

    stmt, params = named(sql, args)
    result = conn.execute(text(stmt), params)
    return result.first() if first else int(result.rowcount)


async def arun(kind: Driver, conn: Any, sql: str, args: tuple[Any, ...]) -> int | None:
    """Run ``sql`` (``%s`` placeholders) with ``args`` on the async connection ``conn``
    (psycopg ``AsyncConnection``, SQLAlchemy ``AsyncSession``/``AsyncConnection``) and return the
    affected row count; None, running nothing, for a driver that has no async connections
    (``sqlite``). Driver errors pass through unchanged."""
    if kind == "psycopg":
        async with conn.cursor() as cur:
            await cur.execute(sql, args)
            return int(cur.rowcount)
    if kind == "sqlalchemy":
        from sqlalchemy import text

        stmt, params = named(sql, args)
        return int((await conn.execute(text(stmt), params)).rowcount)
    return None
