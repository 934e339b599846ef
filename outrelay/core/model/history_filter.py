"""Which events a history read returns, and the test that decides it.

:class:`HistoryFilter` is what the stores' ``history`` methods take
(:mod:`outrelay.core.stores.base`) and what the readers of
:mod:`outrelay.core.history.history` build; :func:`matches` is the filter run in
Python (the default ``Store.history``), :func:`glob_to_like` the same type
globs as SQL ``LIKE`` patterns (the PostgreSQL store). Both must agree.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from functools import lru_cache
from typing import Any, Literal

from outrelay.core.model.envelope import Event

__all__ = ["HistoryFilter", "filter_sql", "glob_to_like", "matches"]


@dataclasses.dataclass(frozen=True, slots=True)
class HistoryFilter:
    """Which events a history read returns; every field left empty matches all.

    ``types`` are shell-style globs (``order.*``, ``*.created``) matched
    case-sensitively; ``since``/``until`` bound the event ``time`` (Unix
    seconds, ``since <= time < until``).
    """

    stream: str | None = None
    types: tuple[str, ...] = ()
    tenant: str | None = None
    since: float | None = None
    until: float | None = None


@lru_cache(maxsize=256)
def _glob_re(pattern: str) -> re.Pattern[str]:
    return re.compile(fnmatch.translate(pattern))


def matches(where: HistoryFilter, event: Event) -> bool:
    """Whether ``event`` passes ``where`` (the same test the stores run in SQL)."""
    if where.stream is not None and event.stream != where.stream:
        return False
    if where.tenant is not None and event.tenant != where.tenant:
        return False
    if where.types and not any(_glob_re(t).match(event.type) for t in where.types):
        return False
    ts = event.time.timestamp()
    if where.since is not None and ts < where.since:
        return False
    return where.until is None or ts < where.until


def glob_to_like(pattern: str) -> str:
    """A shell glob (``*``, ``?``) as a SQL LIKE pattern with ``\\`` as escape."""
    out = []
    for ch in pattern:
        if ch in "\\%_":
            out.append("\\" + ch)
        elif ch == "*":
            out.append("%")
        elif ch == "?":
            out.append("_")
        else:
            out.append(ch)
    return "".join(out)


def filter_sql(where: HistoryFilter, dialect: Literal["sqlite", "postgresql"]) -> tuple[str, list[Any]]:
    """``where`` as SQL conditions on the events table's columns, each starting with `` AND ``,
    and their arguments in order: ``?`` and ``GLOB`` for SQLite (its own case-sensitive
    shell-style match), ``%s`` and ``LIKE ANY`` of :func:`glob_to_like` patterns for PostgreSQL.
    The same test as :func:`matches`."""
    mark = "?" if dialect == "sqlite" else "%s"
    sql: list[str] = []
    args: list[Any] = []
    if where.stream is not None:
        sql.append(f" AND stream = {mark}")
        args.append(where.stream)
    if where.types and dialect == "sqlite":
        sql.append(" AND (" + " OR ".join("type GLOB ?" for _ in where.types) + ")")
        args += where.types
    elif where.types:
        sql.append(" AND type LIKE ANY(%s)")
        args.append([glob_to_like(t) for t in where.types])
    for column, op, value in (("tenant", "=", where.tenant), ("time", ">=", where.since), ("time", "<", where.until)):
        if value is not None:
            sql.append(f" AND {column} {op} {mark}")
            args.append(value)
    return "".join(sql), args
