"""A slow webhook receiver gets each event once: ``outrelay run --drain`` and a SIGTERM mid-batch.

The user's case: a receiver answering 200 after 5 s per request, 5 streams x
14 events, default settings (``attempt_timeout`` 60 s, 16 events per stream
per batch): a lane of 14 takes 70 s. Here every time is scaled down 25x (0.2
s per request, ``attempt_timeout`` 2.4 s) so the run takes a few seconds; the
proportions — a lane longer than the deadline — are the same.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
import sys
import time
from pathlib import Path

from outrelay import Event, Outbox

DELAY = 0.2
ATTEMPT_TIMEOUT = 2.4


class SlowReceiver:
    """HTTP/1.1 on loopback answering every POST 200 after ``DELAY`` s; records each request's
    ``webhook-id`` when it arrives (a request cut before the answer still counts as a POST)."""

    def __init__(self) -> None:
        self.posts: list[tuple[str, str]] = []  # (event id, stream) in arrival order
        self._server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> SlowReceiver:
        self._server = await asyncio.start_server(self._conn, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/hook"
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
                lines = head.decode("latin-1").split("\r\n")[1:]
                headers = {k.lower(): v for k, _, v in (line.partition(": ") for line in lines) if v}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.posts.append((headers.get("webhook-id", ""), str(json.loads(body).get("partitionkey"))))
                await asyncio.sleep(DELAY)
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()


def _setup(tmp_path: Path, url: str, streams: int, per_stream: int) -> tuple[Path, list[Event]]:
    db = tmp_path / "o.db"
    cfg = tmp_path / "outrelay.toml"
    cfg.write_text(
        f'[outbox]\nurl = "sqlite:///{db}"\n[relay]\npoll_interval = 0.05\nshutdown_grace = 5\n'
        f'[destinations.hooks]\ntransport = "webhook"\nurl = "{url}"\nallow_private_network = true\n'
        f'mode = "structured"\nattempt_timeout = {ATTEMPT_TIMEOUT}\n'
    )
    events = [Event(type="order.paid", stream=f"s{i % streams}", data={"i": i}) for i in range(streams * per_stream)]
    with Outbox.open(f"sqlite:///{db}") as outbox:
        outbox.append(events)
    return cfg, events


def _assert_once_in_order(posts: list[tuple[str, str]], events: list[Event]) -> None:
    counts = collections.Counter(event_id for event_id, _ in posts)
    assert counts == collections.Counter(e.id for e in events), (
        f"{len(posts)} POSTs for {len(events)} events; sent more than once: {[i for i, n in counts.items() if n > 1]}"
    )
    for stream in {e.stream for e in events}:
        got = [event_id for event_id, s in posts if s == stream]
        assert got == [e.id for e in events if e.stream == stream], f"stream {stream} out of order"


async def _outrelay(*args: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "outrelay", *args, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
    )


async def test_run_drain_posts_each_event_once_to_a_slow_receiver(tmp_path: Path) -> None:
    """5 streams x 14 events, each request answered after 0.2 s against a 2.4 s attempt deadline (a lane
    takes 2.8 s): `outrelay run --drain` makes exactly 70 POSTs, each stream in order, and exits 0."""
    async with SlowReceiver() as receiver:
        cfg, events = _setup(tmp_path, receiver.url, 5, 14)
        proc = await _outrelay("run", "--drain", "-c", str(cfg))
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        _assert_once_in_order(receiver.posts, events)


async def test_sigterm_mid_batch_then_restart_sends_only_the_unconfirmed(tmp_path: Path) -> None:
    """SIGTERM while a slow batch is half confirmed: the relay finishes the requests in flight, starts no
    more and settles the confirmed; `run --drain` afterwards sends only the rest: each event POSTed once."""
    async with SlowReceiver() as receiver:
        cfg, events = _setup(tmp_path, receiver.url, 2, 10)
        proc = await _outrelay("run", "-c", str(cfg))
        try:
            deadline = time.monotonic() + 20
            while len(receiver.posts) < 6 and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            assert len(receiver.posts) >= 6, "the relay never sent"
            proc.send_signal(signal.SIGTERM)
            _, err = await asyncio.wait_for(proc.communicate(), 15)
            assert proc.returncode == 0, err.decode()
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        first = len(receiver.posts)
        assert first < len(events), "the batch was not cut: nothing left to check"
        proc = await _outrelay("run", "--drain", "-c", str(cfg))
        _, err = await asyncio.wait_for(proc.communicate(), 60)
        assert proc.returncode == 0, err.decode()
        _assert_once_in_order(receiver.posts, events)
