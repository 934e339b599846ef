"""The PostgreSQL append examples in examples/ run and deliver what they committed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

from tests.stores.conftest import PG_URL, pg_admin_url

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = {
    "postgres_append_psycopg.py": ("outrelay_example", ["delivered order.placed order-1"]),
    "postgres_append_async.py": ("outrelay_example_async", ["delivered payment.captured p-1"]),
    "postgres_append_sqlalchemy.py": ("outrelay_example_sa", ["user-ada", "user-bob"]),
}


@pytest.mark.parametrize("script", sorted(EXAMPLES))
def test_example_runs(script: str, pg_schema: str) -> None:
    """Each example delivers its committed events and nothing it rolled back."""
    schema, expected = EXAMPLES[script]
    try:
        out = subprocess.run(
            [sys.executable, str(ROOT / "examples" / script), PG_URL.split("?", 1)[0]],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        for line in expected:
            assert line in out.stdout
        assert "order-2" not in out.stdout  # rolled back in the psycopg example
    finally:
        with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
