"""Unrouted events (no destination matched) are counted per reason, logged once per type, and shown by the
run summary, `/metrics` and `outrelay status`."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from outrelay import Event, Outbox, Relay, RouteConfig, parse_config
from outrelay.core.relay.routing import Router
from outrelay.core.relay.unrouted import read_unrouted
from outrelay.plugins.metrics import Metrics


def test_router_counts_what_it_routes_nowhere() -> None:
    """No route matching and every matching destination refusing the tenant are counted per reason and
    type; routed events are not; taking the counts resets them."""
    routes = [RouteConfig(types=("workflow.*",), destinations=("a", "b"))]
    r = Router(routes, ["a", "b"], {"a": ["acme"], "b": ["acme"]})
    assert r(Event(type="workflow.x", stream="s", tenant="acme")) == ["a", "b"]
    assert r(Event(type="order.paid", stream="s")) == [] and r(Event(type="order.paid", stream="t")) == []
    assert r(Event(type="workflow.x", stream="s", tenant="globex")) == []
    assert r.take_unrouted() == {("no_route", "order.paid"): 2, ("tenant", "workflow.x"): 1}
    assert r.take_unrouted() == {}


def _config(tmp_path: Path) -> dict[str, object]:
    return {
        "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
        "relay": {"poll_interval": 0.05},
        "destinations": {"hooks": {"transport": "memory", "broker": f"unrouted-{tmp_path.name}"}},
        "routes": [{"types": ["workflow.*", "activity.failed"], "tenants": ["acme"], "destinations": ["hooks"]}],
    }


async def test_relay_warns_once_per_type_and_records_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Three unrouted order.paid events and one workflow event of another tenant: one WARNING per type naming
    the reason, the summary counts them per reason, the outbox keeps them per type, /metrics shows them."""
    cfg = parse_config(_config(tmp_path))
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append([Event(type="order.paid", stream=f"o-{i}") for i in range(3)])
    outbox.append([Event(type="workflow.created", stream="wf", tenant="acme")])
    outbox.append([Event(type="workflow.created", stream="wf2")])  # no tenant: the route wants acme
    relay = Relay(outbox, cfg)
    with caplog.at_level(logging.WARNING, logger="outrelay.relay"):
        summary = await relay.run(drain=True)
    assert summary.unrouted == {"no_route": 4} and summary.counts["hooks"]["delivered"] == 1
    warned = [r.getMessage() for r in caplog.records if "routed nowhere" in r.getMessage()]
    assert len(warned) == 2 and any("'order.paid'" in w and "no [[routes]] entry matches" in w for w in warned)
    recorded = read_unrouted(cfg.outbox.url)
    assert recorded == {
        "no_route": {
            "count": 4,
            "types": {"order.paid": 3, "workflow.created": 1},
            "last_at": recorded["no_route"]["last_at"],  # type: ignore[index]
        }
    }
    lines = Metrics().render([], relay.unrouted_report.by_reason()).splitlines()
    assert 'outrelay_unrouted_events_total{reason="no_route"} 4' in lines
    assert 'outrelay_unrouted_events_total{reason="tenant"} 0' in lines
