"""/healthz and /readyz on the metrics port, over HTTP."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.plugins.health import Health
from outrelay.plugins.metrics import Metrics, serve_metrics
from outrelay.transports.memory import MemoryTransport
from tests.services import free_port


def _config(tmp_path: Path, **destinations: Any) -> Any:
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": destinations,
        }
    )


async def _get(port: int, path: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=5) as client:
        return await client.get(f"http://127.0.0.1:{port}{path}")


async def _until(port: int, path: str, code: int, bound: float = 10.0) -> httpx.Response:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + bound
    while True:
        resp = await _get(port, path)
        if resp.status_code == code or loop.time() > deadline:
            return resp
        await asyncio.sleep(0.05)


async def test_healthz_and_readyz_of_a_healthy_relay(tmp_path: Path) -> None:
    """/healthz is 200 at once; /readyz is 503 before the relay runs, 200 while it delivers, 503 after it stopped."""
    cfg = _config(tmp_path, mem={"transport": "memory", "broker": "health"})
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append([Event(type="t", stream="s")])
    relay = Relay(outbox, cfg)
    server = await serve_metrics(relay, Metrics(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        assert (await _get(port, "/healthz")).status_code == 200
        before = await _get(port, "/readyz")
        assert before.status_code == 503 and "relay not running" in before.text
        task = asyncio.create_task(relay.run())
        ready = await _until(port, "/readyz", 200)
        assert ready.status_code == 200 and ready.text == "ready\n", ready.text
        for _ in range(200):  # ready means able to deliver: the event arrives (bounded wait)
            if MemoryTransport.broker("health").all():
                break
            await asyncio.sleep(0.02)
        assert len(MemoryTransport.broker("health").all()) == 1
        relay.stop()
        await task
        after = await _get(port, "/readyz")
        assert after.status_code == 503
        assert (await _get(port, "/nope")).status_code == 404
    finally:
        relay.stop()
        server.close()


async def test_readyz_reports_a_stalled_destination(tmp_path: Path) -> None:
    """A destination failing without one success beyond the stall threshold makes /readyz 503, naming it and the
    error; a healthy one beside it is not blamed."""
    refused = free_port()  # nothing listens there: every delivery is refused
    cfg = _config(
        tmp_path,
        hook={
            "transport": "webhook",
            "url": f"http://127.0.0.1:{refused}/in",
            "allow_private_network": True,
            "retry": {"initial_delay": 0.05, "max_delay": 0.1, "max_attempts": 1000},
        },
        mem={"transport": "memory", "broker": "health2"},
    )
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append([Event(type="t", stream="s")])
    relay = Relay(outbox, cfg)
    health = Health(relay, stall_after=0.5)
    relay.registry.pm.register(health)
    server = await serve_metrics(relay, Metrics(), "127.0.0.1", 0, health)
    port = server.sockets[0].getsockname()[1]
    task = asyncio.create_task(relay.run())
    try:
        resp = await _get(port, "/readyz")
        for _ in range(200):  # 503 may first be "not running"; wait (bounded) for the stall verdict
            if "destination hook: failing for" in resp.text:
                break
            await asyncio.sleep(0.05)
            resp = await _get(port, "/readyz")
        assert resp.status_code == 503
        assert "destination hook: failing for" in resp.text and "cannot deliver" in resp.text, resp.text
        assert "destination mem" not in resp.text
        assert len(resp.text.strip().splitlines()) == 1
    finally:
        relay.stop()
        await task
        server.close()


class _UnreachableStore:
    """An outbox store whose every query fails, as a database that went away does."""

    def unrouted(self) -> int:
        raise OSError("connection refused by 127.0.0.1:5432")


class _RelayWithoutStore:
    """The parts of a running Relay that Health reads, with a store that fails."""

    def __init__(self) -> None:
        self.stopping = False
        self.workers: dict[str, Any] = {}
        self.store = _UnreachableStore()

    async def db(self, fn: Any, *args: Any) -> Any:
        return fn(*args)


async def test_readyz_reports_an_unreachable_outbox() -> None:
    """When the outbox query fails, readiness is false with the store's error on one line."""
    health = Health(_RelayWithoutStore())
    health.running = True
    verdict = await health.readiness()
    assert not verdict.ready
    assert verdict.reasons == ("outbox unreachable: connection refused by 127.0.0.1:5432",)
