"""The per-attempt deadline and the bounded stop, against an HTTP receiver that drips its answer."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.contract.transport import Delivered, Message, SendResult
from outrelay.transports.memory import MemoryConfig, MemoryTransport

GRACE = 1.0


class DripServer:
    """HTTP/1.1 on loopback: requests whose body mentions stream ``slow`` get headers, then 1 byte/s;
    the rest get 204 at once. Records the ``webhook-id`` of every request it answered in full."""

    def __init__(self) -> None:
        self.answered: list[str] = []
        self.dripping = 0
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> DripServer:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/hook"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                headers = dict(
                    line.split(": ", 1) for line in head.decode("latin-1").lower().split("\r\n")[1:] if ": " in line
                )
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if b'"slow"' in body:
                    self.dripping += 1
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
                    for _ in range(1000):
                        await writer.drain()
                        writer.write(b"x")
                        await asyncio.sleep(1.0)
                self.answered.append(headers.get("webhook-id", ""))
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client gave up (deadline, stop) or the test ended: this connection is done
        finally:
            writer.close()


def config_doc(tmp_path: Path, url: str, attempt_timeout: float) -> dict[str, Any]:
    return {
        "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
        "relay": {"poll_interval": 0.05, "shutdown_grace": GRACE},
        "destinations": {
            "hooks": {
                "transport": "webhook",
                "url": url,
                "allow_private_network": True,
                "timeout": 600,  # the transport's own per-phase timeout would never fire: the relay's must
                "attempt_timeout": attempt_timeout,
                "retry": {"initial_delay": 0.05, "max_delay": 0.2, "max_attempts": 1000},
            }
        },
    }


async def test_attempt_deadline_fails_the_slow_stream_and_others_flow(tmp_path: Path) -> None:
    """A dripping answer fails its attempt after attempt_timeout; the other streams are all delivered meanwhile."""
    async with DripServer() as server:
        cfg = parse_config(config_doc(tmp_path, server.url, attempt_timeout=1.0))
        fast = [Event(type="t.x", stream=f"s{i % 10}", data={"i": i}) for i in range(30)]
        with Outbox.open(cfg.outbox.url) as outbox:
            outbox.append([Event(type="t.x", stream="slow"), *fast])
        relay = Relay(config=cfg)
        task = asyncio.create_task(relay.run())
        try:
            deadline = time.monotonic() + 15
            while time.monotonic() < deadline and not (
                relay.workers and relay.workers["hooks"].counts["delivered"] == len(fast) and server.dripping >= 2
            ):
                await asyncio.sleep(0.05)
            assert {e.id for e in fast} <= set(server.answered)
            assert server.dripping >= 2  # the slow stream failed its first attempt and was retried
            error = relay.workers["hooks"].last_error or ""
            assert "timed out after 1s (attempt_timeout)" in error
        finally:
            relay.stop()
            started = time.monotonic()
            summary = await task
            assert time.monotonic() - started < GRACE + 5
        assert summary.remaining == 1  # the slow event stays pending: nothing lost


async def test_sigterm_exits_within_grace_with_a_send_hanging(tmp_path: Path) -> None:
    """SIGTERM to `outrelay run` with a send stuck on a dripping answer exits within shutdown_grace + 5 s,
    leaving the event pending and its lane free for the next relay."""
    async with DripServer() as server:
        doc = config_doc(tmp_path, server.url, attempt_timeout=600)
        cfg_file = tmp_path / "outrelay.toml"
        cfg_file.write_text(_toml(doc))
        with Outbox.open(doc["outbox"]["url"]) as outbox:
            outbox.append(Event(type="t.x", stream="slow"))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "outrelay", "run", "-c", str(cfg_file), stderr=asyncio.subprocess.PIPE
        )
        try:
            deadline = time.monotonic() + 20
            while not server.dripping and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert server.dripping, "the relay never sent"
            await asyncio.sleep(0.5)
            proc.send_signal(signal.SIGTERM)
            started = time.monotonic()
            rc = await asyncio.wait_for(proc.wait(), GRACE + 5)
            assert time.monotonic() - started < GRACE + 5 and rc == 0
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        with Outbox.open(doc["outbox"]["url"]) as outbox:
            claimed = outbox.store.claim("hooks", limit=10, per_lane=1, owner="next", lease_seconds=30, now=time.time())
            assert [c.event.stream for c in claimed] == ["slow"]


def _toml(doc: dict[str, Any]) -> str:
    dest = doc["destinations"]["hooks"]
    retry = dest.pop("retry")
    lines = [f'[outbox]\nurl = "{doc["outbox"]["url"]}"', "[relay]"]
    lines += [f"{k} = {v}" for k, v in doc["relay"].items()]
    lines.append("[destinations.hooks]")
    lines += [f"{k} = {_value(v)}" for k, v in dest.items()]
    lines.append("[destinations.hooks.retry]")
    lines += [f"{k} = {v}" for k, v in retry.items()]
    return "\n".join(lines) + "\n"


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return f'"{v}"' if isinstance(v, str) else str(v)


class Stubborn(MemoryTransport):
    """A transport whose send and close ignore cancellation until ``released`` (a misbehaving plugin)."""

    released = False

    async def _hang(self) -> None:
        while not Stubborn.released:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                continue  # deliberately swallowed: the relay must not wait for this

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        await self._hang()
        return [Delivered() for _ in batch]

    async def close(self) -> None:
        await self._hang()


async def test_stop_is_bounded_when_a_transport_ignores_cancellation(tmp_path: Path) -> None:
    """Relay.stop() returns within shutdown_grace + 5 s even if send and close ignore cancellation; the event
    stays pending and its lane is released."""
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05, "shutdown_grace": GRACE},
            "destinations": {"stubborn": {"transport": "memory", "attempt_timeout": 600}},
        }
    )
    Stubborn.released = False
    outbox = Outbox.open(cfg.outbox.url)
    outbox.append(Event(type="t.x", stream="s"))
    relay = Relay(outbox, cfg, transports={"stubborn": Stubborn(MemoryConfig(), destination="stubborn")})
    task = asyncio.create_task(relay.run())
    try:
        deadline = time.monotonic() + 10
        while not (relay.workers and relay.workers["stubborn"].inflight) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        relay.stop()
        started = time.monotonic()
        summary = await asyncio.wait_for(task, GRACE + 5)
        assert time.monotonic() - started < GRACE + 5
        assert summary.remaining == 1
        claimed = outbox.store.claim("stubborn", limit=5, per_lane=1, owner="next", lease_seconds=30, now=time.time())
        assert [c.event.stream for c in claimed] == ["s"]
    finally:
        Stubborn.released = True  # let the abandoned coroutines end before the loop closes
        await asyncio.sleep(0.2)
        outbox.close()
