"""A destination that declares ``tenants`` never receives another tenant's event, on SQLite and PostgreSQL."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.memory import MemoryTransport
from tests.stores.conftest import pg_url

FAST = {"initial_delay": 0.01, "max_delay": 0.05, "jitter": 0.0}


@pytest.fixture(params=["sqlite", "postgres"])
def outbox_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/o.db"
    return pg_url(request.getfixturevalue("pg_schema"))


def _config(url: str, routes: list[dict[str, Any]] | None = None) -> Any:
    return parse_config(
        {
            "outbox": {"url": url},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "acme_only": {"transport": "memory", "broker": "acme", "tenants": ["acme"], "retry": FAST},
                "all": {"transport": "memory", "broker": "all", "retry": FAST},
            },
            "routes": routes or [],
        }
    )


def _tenants(broker: str) -> list[str | None]:
    return sorted((m.event.tenant for m in MemoryTransport.broker(broker).all()), key=str)


EVENTS = [("acme", 0), ("globex", 1), (None, 2), ("acme", 3), ("acme.orders", 4), ("ACME", 5)]


async def _run(url: str, routes: list[dict[str, Any]] | None = None) -> None:
    cfg = _config(url, routes)
    outbox = Outbox.open(url)
    try:
        outbox.append([Event(type="t", stream=f"s{i}", tenant=t, data={"i": i}) for t, i in EVENTS])
        relay = Relay(outbox, cfg)
        assert relay.router.static_destinations is None  # the static INSERT ... SELECT path would ignore tenants
        summary = await relay.run(drain=True)
        assert summary.dead_lettered == 0
    finally:
        outbox.close()


async def test_tenant_restricted_destination_without_routes(outbox_url: str) -> None:
    """With no routes, a destination with tenants=["acme"] gets only acme's events; the others get all."""
    await _run(outbox_url)
    assert _tenants("acme") == ["acme", "acme"]
    assert len(_tenants("all")) == len(EVENTS)


async def test_routes_cannot_send_another_tenant_there(outbox_url: str) -> None:
    """A route sending every event (and globex's explicitly) to acme_only still delivers only acme's events."""
    routes = [
        {"types": ["*"], "destinations": ["acme_only", "all"]},
        {"tenants": ["globex"], "destinations": ["acme_only"]},
    ]
    await _run(outbox_url, routes)
    assert _tenants("acme") == ["acme", "acme"]
    assert len(_tenants("all")) == len(EVENTS)


async def test_operator_replay_of_a_foreign_event_is_rejected(outbox_url: str) -> None:
    """A replay that queues globex's event for acme_only (bypassing the router) dead-letters it, never sends it."""
    await _run(outbox_url)
    outbox = Outbox.open(outbox_url)
    try:
        foreign = [e.sequence for e in outbox.store.events() if e.tenant == "globex"]
        assert outbox.store.replay_events("acme_only", [s for s in foreign if s is not None], now=time.time()) == 1
        summary = await Relay(outbox, _config(outbox_url)).run(drain=True)
        (dead,) = outbox.store.dead_letters()
        assert summary.dead_lettered == 1 and dead.destination == "acme_only" and dead.event.tenant == "globex"
        assert "tenant 'globex' is not served by destination 'acme_only'" in dead.reason
    finally:
        outbox.close()
    assert _tenants("acme") == ["acme", "acme"]
