"""Store fixtures: every semantic test runs against SQLite and PostgreSQL.

PostgreSQL tests use ``OUTRELAY_POSTGRES_URL`` (default
``postgresql://postgres@127.0.0.1:5432/test``); each test gets a schema of
its own, dropped afterwards. Without a server they skip via
:func:`tests.services.need`.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from outrelay.core.stores.base import Store
from tests.services import need

PG_URL = os.environ.get("OUTRELAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pg_admin_url() -> str:
    """The server URL without outrelay's query options (for test bookkeeping)."""
    return PG_URL.split("?", 1)[0]


def _pg_available() -> str | None:
    try:
        import psycopg
    except ImportError:
        return "psycopg is not installed (pip install 'outrelay[postgres]')"
    try:
        with psycopg.connect(pg_admin_url(), connect_timeout=3):
            return None
    except psycopg.Error as exc:
        return f"cannot connect to {pg_admin_url()} ({str(exc).strip().splitlines()[0]}); set OUTRELAY_POSTGRES_URL"


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name on the test PostgreSQL, dropped after the test."""
    why = _pg_available()
    if why:
        need("PostgreSQL", why)
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    yield schema
    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def pg_url(schema: str, **params: str) -> str:
    sep = "&" if "?" in PG_URL else "?"
    extra = "".join(f"&{k}={v}" for k, v in params.items())
    return f"{PG_URL}{sep}schema={schema}{extra}"


@pytest.fixture(params=["sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind."""
    if request.param == "sqlite":
        from outrelay.core.stores.sqlite import SQLiteStore

        s: Store = SQLiteStore(f"sqlite:///{tmp_path}/outbox.db")
    else:
        schema = request.getfixturevalue("pg_schema")
        from outrelay.core.stores.postgres import PostgresStore

        s = PostgresStore(pg_url(schema))
    yield s
    s.close()
