"""NATS JetStream peers: the shared server and private ones for chaos tests.

``OUTRELAY_NATS_URL`` points the tests at another server (default
``nats://127.0.0.1:4222``). Every test makes its own uniquely named stream
and deletes it afterwards. :class:`NatsServer` runs a private
``nats-server -js`` with file storage that a test may kill -9 and restart
on the same port and directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sysconfig
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import nats.js.api
import pytest

from tests.services import free_port, need, port_open, wait_port

__all__ = [
    "NATS_ATOMIC_SERVER_BIN",
    "NATS_SERVER_BIN",
    "NatsServer",
    "StreamFactory",
    "nats_server",
    "nats_streams",
    "nats_url",
    "one_stream",
    "private_nats_server",
]

NATS_SERVER_BIN = os.environ.get("OUTRELAY_NATS_SERVER_BIN") or shutil.which("nats-server") or "/usr/sbin/nats-server"
#: a nats-server of 2.12 or newer (atomic batches): the one the dev extra's nats-server-bin puts beside the interpreter
NATS_ATOMIC_SERVER_BIN = os.environ.get("OUTRELAY_NATS_ATOMIC_SERVER_BIN") or str(
    Path(sysconfig.get_path("scripts")) / "nats-server"
)


@pytest.fixture(scope="session")
def nats_url() -> str:
    """The NATS server under test; skips (fails in CI) when it is unreachable."""
    url = os.environ.get("OUTRELAY_NATS_URL", "nats://127.0.0.1:4222")
    parts = urlsplit(url)
    if not port_open(parts.hostname or "127.0.0.1", parts.port or 4222):
        need(
            "NATS JetStream",
            f"nothing listens at {parts.hostname}:{parts.port}; start nats-server -js or set OUTRELAY_NATS_URL",
        )
    return url


class StreamFactory:
    """Creates unique streams on one server and deletes them at teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.created: list[str] = []

    async def __call__(
        self, prefix: str = "t", *, duplicate_window: float = 120.0, storage: str = "memory", **config: Any
    ) -> tuple[str, str]:
        """Create a stream (more of its ``config`` as ``add_stream`` takes it, e.g. ``allow_atomic``);
        return ``(stream_name, subject_prefix)`` (the stream takes ``prefix.>``)."""
        tag = uuid.uuid4().hex[:10]
        name, subject = f"OR_{prefix}_{tag}".upper(), f"or.{prefix}.{tag}"
        nc = await nats.connect(self.url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
        try:
            await nc.jetstream().add_stream(
                name=name,
                subjects=[f"{subject}.>"],
                storage=nats.js.api.StorageType(storage),
                duplicate_window=duplicate_window,
                **config,
            )
        finally:
            await nc.close()
        self.created.append(name)
        return name, subject

    async def delete_all(self) -> None:
        if not self.created:
            return
        nc = await nats.connect(self.url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
        try:
            js = nc.jetstream()
            for name in self.created:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await js.delete_stream(name)
        finally:
            await nc.close()


@contextlib.asynccontextmanager
async def one_stream(url: str, kind: str, **config: Any) -> AsyncIterator[tuple[str, str]]:
    """A fresh stream ``OR_<KIND>_<tag>`` taking ``or.<kind>.<tag>.>`` (more ``config`` as ``add_stream``
    takes it); yields ``(name, subject prefix)`` and deletes the stream afterwards."""
    tag = uuid.uuid4().hex[:8]
    name, prefix = f"OR_{kind}_{tag}".upper(), f"or.{kind}.{tag}"
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
    try:
        await nc.jetstream().add_stream(name=name, subjects=[f"{prefix}.>"], **config)
        yield name, prefix
    finally:
        with contextlib.suppress(nats.js.errors.NotFoundError):
            await nc.jetstream().delete_stream(name)
        await nc.close()


@pytest.fixture
async def nats_streams(nats_url: str) -> AsyncIterator[StreamFactory]:
    """``await nats_streams("prefix")`` makes a fresh stream, deleted after the test."""
    factory = StreamFactory(nats_url)
    yield factory
    await factory.delete_all()


class NatsServer:
    """A private ``nats-server -js`` with file storage in ``store_dir`` (kill/restart at will)."""

    def __init__(
        self, store_dir: Path, port: int | None = None, args: Sequence[str] = (), binary: str = NATS_SERVER_BIN
    ) -> None:
        self.store_dir = store_dir
        self.binary = binary
        self.port = port or free_port()
        self._port_chosen = port is None  # ours to re-pick if another process wins the race for it
        self._started = False
        self.args = tuple(args)  # e.g. ("--user", "u", "--pass", "p") or TLS options
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        """Start (or restart, on the same port). A first start on a port we picked ourselves tries
        another free port if someone else took it between free_port() and the bind."""
        for _ in range(3 if self._port_chosen and not self._started else 1):
            args = [self.binary, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.store_dir)]
            self.proc = subprocess.Popen([*args, *self.args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            # the port must answer *and* be ours: if the bind failed, nats-server exits at once and
            # wait_port() would be answered by whoever holds the port
            if wait_port("127.0.0.1", self.port, 10) and self._settled():
                self._started = True
                return
            self.kill()
            self.port = free_port()
        raise RuntimeError(f"nats-server did not start (port taken, or it exited); last port {self.port}")

    def _settled(self) -> bool:
        """Still running a moment after the port answered (a failed bind exits within that)."""
        time.sleep(0.2)
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        """kill -9: no shutdown, no flush."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def nats_server(tmp_path: Path) -> Iterator[NatsServer]:
    """A private, started JetStream server; always killed at teardown."""
    with private_nats_server(tmp_path) as server:
        yield server


@contextlib.contextmanager
def private_nats_server(
    tmp_path: Path, args: Sequence[str] = (), binary: str = NATS_SERVER_BIN
) -> Iterator[NatsServer]:
    """Start a private JetStream server (``binary``) with extra ``args``; kill it on exit."""
    if not os.path.exists(binary):
        need(
            "nats-server binary",
            f"{binary} not found; set OUTRELAY_NATS_SERVER_BIN (2.12+: OUTRELAY_NATS_ATOMIC_SERVER_BIN)",
        )
    server = NatsServer(tmp_path / f"js-{uuid.uuid4().hex[:6]}", args=args, binary=binary)
    server.start()
    try:
        yield server
    finally:
        server.kill()
