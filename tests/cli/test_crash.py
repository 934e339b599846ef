"""A relay process killed mid-drain loses nothing (real webhook receiver, real subprocesses)."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from collections import defaultdict
from pathlib import Path

from outrelay import Event, Outbox
from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest

SECRET = "whsec_" + "c2VjcmV0LWZvci10aGUtY3Jhc2gtdGVzdA=="

CONFIG = """
[outbox]
url = "sqlite:///{db}"
[relay]
poll_interval = 0.1
shutdown_grace = 5
[destinations.hooks]
transport = "webhook"
url = "{url}"
secret = "{secret}"
allow_private_network = true
batch_size = 50
[destinations.hooks.retry]
initial_delay = 0.05
max_delay = 0.5
"""


async def start_relay(cfg: Path, *args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "outrelay",
        "run",
        "-c",
        str(cfg),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )


def first_delivery_order(rx: WebhookReceiver) -> dict[str, list[int]]:
    seen: dict[str, list[int]] = defaultdict(list)
    ids: set[str] = set()
    for e in rx.events():
        if e.id not in ids:
            ids.add(e.id)
            seen[e.stream].append(e.json()["i"])
    return seen


async def test_sigkill_mid_drain_loses_nothing(tmp_path: Path) -> None:
    """SIGKILL mid-drain, then a restart: every event arrives, signed, first deliveries in order per stream."""

    async def slow(_: WebhookRequest) -> int:
        await asyncio.sleep(0.002)
        return 204

    n, streams = 2000, 20
    async with WebhookReceiver(secrets=SECRET, respond=slow) as rx:
        cfg = tmp_path / "outrelay.toml"
        cfg.write_text(CONFIG.format(db=tmp_path / "o.db", url=rx.url, secret=SECRET))
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox:
            outbox.append([Event(type="workflow.step", stream=f"wf-{i % streams}", data={"i": i}) for i in range(n)])
        proc = await start_relay(cfg)
        assert await rx.wait_for(300, timeout=120), "the relay delivered nothing"
        os.kill(proc.pid, signal.SIGKILL)
        await proc.wait()
        before = len({e.id for e in rx.events()})
        assert before < n, "everything arrived before the kill; the test proved nothing"
        proc = await start_relay(cfg, "--drain")
        _, err = await asyncio.wait_for(proc.communicate(), timeout=300)
        assert proc.returncode == 0, err.decode()
        assert all(r.verified for r in rx.requests)
        seen = first_delivery_order(rx)
        assert sorted(i for items in seen.values() for i in items) == list(range(n))
        for stream, items in seen.items():
            assert items == sorted(items), f"{stream}: first deliveries out of order"


async def test_sigterm_is_graceful(tmp_path: Path) -> None:
    """SIGTERM stops the relay with exit 0, and a later drain delivers the rest without loss."""
    n = 1000
    async with WebhookReceiver(secrets=SECRET) as rx:
        cfg = tmp_path / "outrelay.toml"
        cfg.write_text(CONFIG.format(db=tmp_path / "o.db", url=rx.url, secret=SECRET))
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox:
            outbox.append([Event(type="t", stream=f"s{i % 10}", data={"i": i}) for i in range(n)])
        proc = await start_relay(cfg)
        assert await rx.wait_for(50, timeout=120)
        proc.send_signal(signal.SIGTERM)
        _, err = await asyncio.wait_for(proc.communicate(), timeout=60)
        assert proc.returncode == 0, err.decode()
        assert "Traceback" not in err.decode()
        proc = await start_relay(cfg, "--drain")
        await asyncio.wait_for(proc.communicate(), timeout=300)
        assert proc.returncode == 0
        assert {e.json()["i"] for e in rx.events()} == set(range(n))
