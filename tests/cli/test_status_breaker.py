"""An open circuit breaker is visible in `outrelay status`, /readyz and /metrics, and gone once it closes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import orjson

from outrelay import Event, Outbox, Relay, load_config
from outrelay.plugins.health import Health
from outrelay.plugins.metrics import Metrics
from outrelay.transports.webhook.receiver import WebhookReceiver
from tests.cli.conftest import Cli
from tests.transports.webhook_support import SECRET


async def _until(predicate: Callable[[], bool], timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


async def test_open_breaker_in_status_readyz_and_metrics(tmp_path: Path, cli: Cli) -> None:
    """While the breaker is open, status (text and JSON), /readyz and /metrics say so; after it closes, none does."""
    async with WebhookReceiver(secrets=SECRET, respond=lambda req: 503) as rx:
        (tmp_path / "outrelay.toml").write_text(
            f"""
[outbox]
url = "sqlite:///{tmp_path}/o.db"
[relay]
poll_interval = 0.05
[destinations.hooks]
transport = "webhook"
url = "{rx.url}"
secret = "{SECRET}"
allow_private_network = true
retry = {{ initial_delay = 0.05, max_delay = 0.1 }}
breaker = {{ failures = 2, probe_interval = 2.5 }}
"""
        )
        cfg = load_config(tmp_path / "outrelay.toml")
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append([Event(type="t", stream="s1", data={"i": 1})])
        relay = Relay(outbox, cfg)
        metrics, health = Metrics(), Health(relay)
        relay.registry.pm.register(metrics)
        relay.registry.pm.register(health)
        running = asyncio.create_task(relay.run())
        try:
            await _until(lambda: "hooks" in relay.workers)
            breaker = relay.workers["hooks"].breaker
            assert breaker is not None
            await _until(lambda: breaker.open and not breaker.dirty)
            verdict = await health.readiness()
            shown = await asyncio.to_thread(cli, "status", "--json")
            text = await asyncio.to_thread(cli, "status")
            gauges = metrics.render(await relay.db(relay.store.status, ["hooks"], time.time()))
            assert not verdict.ready and "hooks: circuit breaker open" in verdict.body()
            [dest] = orjson.loads(shown.stdout)["destinations"]
            assert dest["state"].startswith("circuit breaker open") and "503" in dest["state"]
            assert dest["breaker"][0]["owner"] == relay.owner and dest["breaker"][0]["probe_interval"] == 2.5
            assert "hooks (webhook) circuit breaker open" in text.stdout
            assert 'outrelay_breaker_open{destination="hooks"} 1\n' in gauges
            assert 'outrelay_breaker_transitions_total{destination="hooks",state="open"} 1\n' in gauges

            rx.respond = None  # back: the next probe closes it
            await _until(lambda: not breaker.open and not breaker.dirty)
            after = orjson.loads((await asyncio.to_thread(cli, "status", "--json")).stdout)["destinations"][0]
            assert after["breaker"] == [] and after["state"] == "ok"
            assert (await health.readiness()).ready
            gauges = metrics.render(await relay.db(relay.store.status, ["hooks"], time.time()))
            assert 'outrelay_breaker_open{destination="hooks"} 0\n' in gauges
        finally:
            relay.stop()
            await running
            outbox.close()
