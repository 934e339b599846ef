"""The unrouted-event counts live next to the outbox, in SQLite or in PostgreSQL (its schema and prefix)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrelay import ConfigError, Outbox, parse_config
from outrelay.cli._validate import open_existing
from outrelay.core.relay.unrouted import add_unrouted, read_unrouted
from tests.stores.conftest import pg_url


@pytest.fixture(params=["sqlite", "postgres"])
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/outbox.db"
    return pg_url(request.getfixturevalue("pg_schema"), prefix="app_")


def test_counts_add_up_and_reading_creates_nothing(url: str) -> None:
    """Reading before anything was recorded gives {} and creates no table; two writes add up per
    (reason, type) and keep the latest time."""
    Outbox.open(url).close()
    assert read_unrouted(url) == {}
    add_unrouted(url, {("no_route", "order.paid"): 2}, 100.0)
    add_unrouted(url, {("no_route", "order.paid"): 1, ("tenant", "workflow.x"): 4}, 200.0)
    assert read_unrouted(url) == {
        "no_route": {"count": 3, "types": {"order.paid": 3}, "last_at": 200.0},
        "tenant": {"count": 4, "types": {"workflow.x": 4}, "last_at": 200.0},
    }


def test_operator_commands_need_an_existing_outbox(url: str) -> None:
    """An operator command's outbox must exist: a database without outrelay's tables is refused (and is
    left without them); once created, it opens."""
    cfg = parse_config({"outbox": {"url": url}})
    with pytest.raises(ConfigError, match="outbox"):
        open_existing(cfg)
    with pytest.raises(ConfigError):
        open_existing(cfg)  # still nothing created by the first attempt
    Outbox.open(url).close()
    open_existing(cfg).close()
