"""The Prometheus metrics plugin."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.plugins.metrics import Metrics, serve_metrics
from outrelay.transports.memory import MemoryTransport


async def test_metrics_scrape(tmp_path: Path) -> None:
    """/metrics reports published and failed counts, the batch histogram and queue gauges per destination."""
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "mem": {"transport": "memory", "broker": "m", "reject_types": ["bad"], "retry": {"initial_delay": 0.01}}
            },
        }
    )
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append([Event(type="ok", stream=f"s{i % 3}") for i in range(30)] + [Event(type="bad", stream="x")])
    relay = Relay(outbox, cfg)
    metrics = Metrics()
    relay.registry.pm.register(metrics)
    task = asyncio.create_task(relay.run())
    server = await serve_metrics(relay, metrics, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        for _ in range(200):
            if len(MemoryTransport.broker("m").all()) == 30 and metrics.failed:
                break
            await asyncio.sleep(0.02)
        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{port}/metrics")).text
            missing = await client.get(f"http://127.0.0.1:{port}/nope")
    finally:
        relay.stop()
        await task
        server.close()
    assert 'outrelay_published_total{destination="mem"} 30' in text
    assert 'outrelay_failed_total{destination="mem",outcome="rejected"} 1' in text
    assert 'outrelay_dead_letters{destination="mem"} 1' in text
    assert 'outrelay_pending{destination="mem"} 0' in text
    assert 'outrelay_batch_seconds_bucket{destination="mem",le="+Inf"}' in text
    assert missing.status_code == 404


async def test_messages_held_back_unsent_are_not_failed_sends(tmp_path: Path) -> None:
    """The issue's case: a webhook receiver answers 503 once; the nine events behind the refused one in its
    stream are held back unsent. outrelay_failed_total counts one retry (the receiver saw one 503), not ten;
    all ten are then published."""
    from outrelay.transports.webhook.receiver import WebhookReceiver

    answers = iter([503])
    async with WebhookReceiver(respond=lambda request: next(answers, 200)) as receiver:
        cfg = parse_config(
            {
                "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
                "relay": {"poll_interval": 0.05},
                "destinations": {
                    "hooks": {
                        "transport": "webhook",
                        "url": receiver.url,
                        "allow_private_network": True,
                        "retry": {"initial_delay": 0.01, "jitter": 0},
                    }
                },
            }
        )
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append([Event(type="ok", stream="s") for _ in range(10)])
        relay = Relay(outbox, cfg)
        metrics = Metrics()
        relay.registry.pm.register(metrics)
        summary = await relay.run(drain=True)
    assert [r.status for r in receiver.requests].count(503) == 1
    assert summary.counts["hooks"]["delivered"] == 10
    lines = metrics.render([]).splitlines()
    assert 'outrelay_failed_total{destination="hooks",outcome="retry"} 1' in lines
    assert 'outrelay_published_total{destination="hooks"} 10' in lines
