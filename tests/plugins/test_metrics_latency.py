"""Metrics of issue 12: delivery latency, consumed events, replay count (scraped as Prometheus text)."""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from outrelay import Event, EventBus, Outbox, Relay, parse_config
from outrelay.core.consumer.subscriber import SubscriptionStats
from outrelay.core.contract.transport import Delivered, Message, Rejected
from outrelay.core.history.replay import replay, replay_counts
from outrelay.plugins.metrics import Metrics, serve_metrics
from outrelay.transports.memory import MemoryTransport

_SAMPLE = re.compile(r'^[a-z_]+(\{[a-z_]+="(?:[^"\\]|\\.)*"(,[a-z_]+="(?:[^"\\]|\\.)*")*\})? -?[0-9.e+]+$')


def _valid_exposition(text: str) -> None:
    """Every line is a HELP/TYPE comment or a sample; each family's TYPE comes before its samples."""
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("# HELP "):
            continue
        assert _SAMPLE.match(line), line
        name = line.split("{")[0].split(" ")[0]
        assert any(name == t or name in (f"{t}_bucket", f"{t}_sum", f"{t}_count") for t in typed), line


def _value(text: str, sample: str) -> float:
    for line in text.splitlines():
        if line.startswith(sample + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sample} not in the scrape")


async def _scrape(relay: Any, metrics: Metrics) -> str:
    server = await serve_metrics(relay, metrics, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with httpx.AsyncClient() as client:
            resp = await client.get(f"http://127.0.0.1:{port}/metrics")
            ready = await client.get(f"http://127.0.0.1:{port}/readyz")
    finally:
        server.close()
    assert resp.status_code == 200 and (relay is not None or ready.status_code == 200)
    return resp.text


class TestDeliveryLatency:
    async def test_histogram_from_event_time_to_ack(self, tmp_path: Path) -> None:
        """Events created 3 s ago land in the (2.5, 5] bucket of outrelay_delivery_latency_seconds."""
        cfg = parse_config(
            {
                "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
                "relay": {"poll_interval": 0.05},
                "destinations": {"mem": {"transport": "memory", "broker": "m"}},
            }
        )
        outbox = Outbox.open(cfg.outbox.url)
        then = datetime.now(UTC) - timedelta(seconds=3)
        outbox.append([Event(type="t", stream=f"s{i % 3}", time=then) for i in range(12)])
        relay = Relay(outbox, cfg)
        metrics = Metrics()
        relay.registry.pm.register(metrics)
        task = asyncio.create_task(relay.run())
        try:
            for _ in range(200):
                if len(MemoryTransport.broker("m").all()) == 12 and metrics.published["mem"] == 12:
                    break
                await asyncio.sleep(0.02)
            text = await _scrape(relay, metrics)
        finally:
            relay.stop()
            await task
            outbox.close()
        _valid_exposition(text)
        h = 'outrelay_delivery_latency_seconds_bucket{destination="mem",le="%s"}'
        assert _value(text, h % "2.5") == 0
        assert _value(text, h % "5.0") == 12
        assert _value(text, h % "+Inf") == 12
        assert _value(text, 'outrelay_delivery_latency_seconds_count{destination="mem"}') == 12
        assert 36 <= _value(text, 'outrelay_delivery_latency_seconds_sum{destination="mem"}') < 60
        assert "# TYPE outrelay_delivery_latency_seconds histogram" in text

    def test_only_confirmed_messages_count(self) -> None:
        """A rejected message adds no latency sample; a clock behind the event time counts as 0 s."""
        metrics = Metrics()
        now = datetime.now(UTC).timestamp()
        future = Event(type="t", stream="s", time=datetime.now(UTC) + timedelta(seconds=30))
        msgs = [Message(future, "t", "s"), Message(Event(type="t", stream="s"), "t", "s")]
        metrics.outrelay_batch_settled(
            destination="d",
            messages=msgs,
            results=[Delivered(), Rejected("no")],
            elapsed=0.01,
            timeline=(now, now, now, now, now),
        )
        text = metrics.render([])
        assert _value(text, 'outrelay_delivery_latency_seconds_bucket{destination="d",le="0.001"}') == 1
        assert _value(text, 'outrelay_delivery_latency_seconds_count{destination="d"}') == 1


class TestConsumed:
    async def test_consumed_by_outcome_in_a_subscriber_process(self) -> None:
        """A watched bus reports handled, skipped and dead-lettered events, retries and the lag of the last
        handled event; no relay needed."""
        metrics = Metrics()

        def handler(e: Event) -> None:
            if e.type == "poison":
                raise ValueError("cannot handle")

        old = datetime.now(UTC) - timedelta(seconds=90)  # appended 90 s ago: the consumer lags that much
        async with EventBus.memory() as bus:
            metrics.watch(bus)
            sub = await bus.subscribe(handler, types=["ok", "poison"], name="billing", max_attempts=2)
            await bus.publish(
                [Event(type="ok", stream=f"s{i}", time=old) for i in range(5)]
                + [Event(type="other", stream="x"), Event(type="poison", stream="p")]
            )
            for _ in range(300):
                if sub.stats.handled + sub.stats.skipped + sub.stats.dead_lettered == 7:
                    break
                await asyncio.sleep(0.01)
            text = await _scrape(None, metrics)
            await sub.unsubscribe()
            after = metrics.render([])  # a stopped subscription's counts stay in the totals
        _valid_exposition(text)
        c = 'outrelay_consumed_total{consumer="billing",outcome="%s"}'
        assert _value(text, c % "handled") == 5
        assert _value(text, c % "skipped") == 1
        assert _value(text, c % "dead_lettered") == 1
        assert _value(text, c % "parked") == 0
        assert _value(text, 'outrelay_consumer_retries_total{consumer="billing"}') == 1
        assert 90 <= _value(text, 'outrelay_consumer_lag_seconds{consumer="billing"}') < 120
        assert _value(after, c % "handled") == 5

    def test_label_values_are_escaped(self) -> None:
        """A consumer name with a quote or backslash still gives a valid sample line."""
        metrics = Metrics()

        class Sub:
            consumer = 'we"ird\\name'
            stats = SubscriptionStats(handled=1)

        metrics.watch(Sub())
        text = metrics.render([])
        _valid_exposition(text)
        assert 'consumer="we\\"ird\\\\name",outcome="handled"} 1' in text


class TestReplayCount:
    def test_folds_and_events_are_counted(self, tmp_path: Path) -> None:
        """Each replay() adds one to outrelay_replays_total and its events to outrelay_replayed_events_total."""
        before = replay_counts()
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox:
            outbox.append([Event(type="t", stream="w", data={"n": i}) for i in range(7)])
            result = replay(outbox.store, "w", lambda n, e: n + 1, 0)
        assert result.state == 7
        text = Metrics().render([])
        _valid_exposition(text)
        assert _value(text, "outrelay_replays_total") == before.folds + 1
        assert _value(text, "outrelay_replayed_events_total") == before.events + 7
