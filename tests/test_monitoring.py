"""The alert rules and the Grafana dashboard shipped in deploy/: promtool accepts the rules and their unit
tests pass, and every metric they name is one a running relay and subscriber serve."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
from pathlib import Path

import httpx

from outrelay import Event, EventBus, Outbox, Relay, parse_config
from outrelay.plugins.metrics import Metrics, serve_metrics
from tests.services import need

ROOT = Path(__file__).parents[1]
RULES = ROOT / "deploy" / "prometheus" / "outrelay-alerts.yml"
RULE_TESTS = ROOT / "deploy" / "prometheus" / "outrelay-alerts.test.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "outrelay-dashboard.json"


def test_promtool_checks_and_tests_the_rules() -> None:
    """`promtool check rules` accepts the rules file and `promtool test rules` passes: each alert fires on
    its condition, once per destination across relays, with the documented text, and stays silent otherwise."""
    promtool = shutil.which("promtool")
    if promtool is None:
        need("promtool", "not on PATH (.ci/run installs it from Debian's prometheus package)")
    for command in ("check", "test"):
        target = RULES if command == "check" else RULE_TESTS
        proc = subprocess.run([promtool, command, "rules", str(target)], capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0 and "SUCCESS" in proc.stdout, proc.stdout + proc.stderr


async def _scrape(tmp_path: Path) -> str:
    """/metrics of a relay with a healthy, a failing and a rejecting destination and an unrouted event, in a
    process that also subscribes (so the consumer metrics are there too)."""
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "ok": {"transport": "memory", "broker": f"mon-{tmp_path.name}"},
                "down": {"transport": "memory", "down": True},
                "picky": {"transport": "memory", "reject_types": ["bad"]},
            },
            "routes": [{"types": ["good", "bad"], "destinations": ["ok", "down", "picky"]}],
        }
    )
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append([Event(type="good", stream="s"), Event(type="bad", stream="b"), Event(type="nowhere", stream="n")])
    relay = Relay(outbox, cfg)
    metrics = Metrics()
    relay.registry.pm.register(metrics)
    task = asyncio.create_task(relay.run())
    server = await serve_metrics(relay, metrics, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with EventBus.memory() as bus:
            metrics.watch(bus)
            sub = await bus.subscribe(lambda e: None, name="billing")
            await bus.publish([Event(type="good", stream="s")])
            for _ in range(300):
                done = metrics.published and metrics.failed and sub.stats.handled and relay.unrouted_report.totals
                if done:
                    break
                await asyncio.sleep(0.02)
            async with httpx.AsyncClient() as client:
                return (await client.get(f"http://127.0.0.1:{port}/metrics")).text
    finally:
        relay.stop()
        await task
        server.close()
        outbox.close()


async def test_every_metric_the_rules_and_dashboard_name_exists(tmp_path: Path) -> None:
    """The metric names in the alert rules and in the dashboard's queries are all served by /metrics."""
    served = {line.split("{")[0].split(" ")[0] for line in (await _scrape(tmp_path)).splitlines() if line[:1] != "#"}
    named = set(re.findall(r"\boutrelay_[a-z_]+", RULES.read_text() + DASHBOARD.read_text()))
    assert named, "no metric names found"
    assert named <= served, f"named but not served: {sorted(named - served)}"
    assert {"outrelay_failing_seconds", "outrelay_consumer_lag_seconds", "outrelay_unrouted_events_total"} <= named
