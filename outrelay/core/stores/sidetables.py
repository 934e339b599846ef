"""Tables next to the outbox that are not the store's own, created on first use.

Features that keep a little state in the outbox database — the circuit
breakers' state that ``outrelay status`` shows, claim-check payloads stored
"in the outbox" — open a short-lived connection of their own with
:func:`side_table`: the SQLite file, or PostgreSQL in the outbox's schema
with its table prefix (``?schema=`` and ``?prefix=`` of the URL). Another
kind of store has no such table: :func:`side_table` then yields None and the
feature says so or does without.

Blocking: call from a worker thread. Every database error is raised as
:class:`~outrelay.core.model.errors.StoreError` (one line, no credentials).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from outrelay.core.model.errors import StoreError
from outrelay.core.stores._caller_tx import driver

__all__ = ["SideTable", "Wording", "side_table", "supports"]


@dataclasses.dataclass(frozen=True)
class SideTable:
    """An open connection (autocommit) and the table's quoted name in it.

    ``mark`` is the parameter placeholder (``?`` or ``%s``); ``blob`` and
    ``real`` the column types for bytes and floating-point seconds.
    """

    conn: Any
    name: str
    mark: str
    blob: str
    real: str

    def execute(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        """Run ``sql`` with ``{t}`` replaced by the table name and ``?`` by :attr:`mark`."""
        return self.conn.execute(sql.format(t=self.name).replace("?", self.mark), args)

    def exists(self) -> bool:
        """Whether the table was created already."""
        if isinstance(self.conn, sqlite3.Connection):
            bare = self.name.strip('"')
            return self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = ?", (bare,)).fetchone() is not None
        return bool(self.conn.execute("SELECT to_regclass(%s) IS NOT NULL", (self.name,)).fetchone()[0])


def supports(url: str) -> bool:
    """Whether an outbox at ``url`` can have side tables (SQLite or PostgreSQL)."""
    return url.startswith(("sqlite:///", "postgresql:", "postgres:", "postgresql+"))


@dataclasses.dataclass(frozen=True)
class Wording:
    """How :func:`side_table` words its errors, for a feature that words them its own way.

    ``cannot_open`` (``{path}``, ``{exc}``) and ``sqlite`` (``{path}``, ``{name}``, ``{exc}``)
    for SQLite; ``postgres`` (``{table}``, ``{exc}``, ``{line}``: the error's first line) for a
    statement that failed on PostgreSQL; ``where(url)`` names the outbox when it cannot be
    connected to.
    """

    cannot_open: str = "cannot open the SQLite outbox {path!r}: {exc}"
    sqlite: str = "table outrelay_{name} of the SQLite outbox {path!r}: {exc}"
    postgres: str = "table {table} of the PostgreSQL outbox: {line}"
    where: Callable[[str], str] | None = None  # None: the URL without its password


#: the wording of side tables' errors (:func:`side_table`'s default)
TABLE_WORDING = Wording()


@contextlib.contextmanager
def side_table(
    url: str, name: str, *, create: bool, timeout: float = 10, wording: Wording = TABLE_WORDING
) -> Iterator[SideTable | None]:
    """A connection to the outbox database at ``url`` and its table ``outrelay_<name>``
    (PostgreSQL: ``<prefix><name>`` in the outbox's schema), closed after; None for a
    store other than SQLite or PostgreSQL, and (without ``create``) for a SQLite file
    that does not exist. A SQLite connection waits up to ``timeout`` seconds for a lock.

    :raises StoreError: the database cannot be opened or a statement failed (as ``wording`` says).
    """
    if url.startswith("sqlite:///"):
        path = url[len("sqlite:///") :]
        if not create and not Path(path).exists():
            yield None
            return
        try:
            db = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise StoreError(wording.cannot_open.format(path=path, exc=exc)) from None
        try:
            yield SideTable(db, f'"outrelay_{name}"', "?", "BLOB", "REAL")
        except sqlite3.Error as exc:
            raise StoreError(wording.sqlite.format(path=path, name=name, exc=exc)) from None
        finally:
            db.close()
        return
    if not supports(url):
        yield None
        return
    from outrelay.core.stores.postgres_pool import connect, parse_url, redact
    from outrelay.core.stores.postgres_schema import Names

    conninfo, opts = parse_url(url, {})
    Names(opts["schema"], opts["prefix"])  # validates both as identifiers
    conn = connect(conninfo, (wording.where or redact)(url))
    table = f'"{opts["schema"]}"."{opts["prefix"]}{name}"'
    try:
        yield SideTable(conn, table, "%s", "BYTEA", "DOUBLE PRECISION")
    except Exception as exc:
        if driver(exc) == "psycopg":
            line = (str(exc).splitlines() or [""])[0]
            raise StoreError(wording.postgres.format(table=table, exc=exc, line=line)) from None
        raise
    finally:
        conn.close()
