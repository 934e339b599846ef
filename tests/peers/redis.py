"""Redis peers for the tests.

``redis_url`` is the shared server (127.0.0.1:6379, or ``OUTRELAY_REDIS_URL``);
tests that kill a server use :class:`OwnRedis`, a private ``redis-server`` on a
free port with AOF persistence in a temp dir, which they may kill -9 and
restart on the same port and directory.

Import the fixtures into a test module: ``from tests.peers.redis import redis_url``.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from tests.services import free_port, need, port_open, wait_port

__all__ = ["OwnRedis", "own_redis", "redis_url"]


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a reachable Redis (skips, or fails in CI, when there is none)."""
    url = os.environ.get("OUTRELAY_REDIS_URL", "redis://127.0.0.1:6379/0")
    parts = urlsplit(url)
    if parts.scheme in ("redis", "rediss") and not port_open(parts.hostname or "127.0.0.1", parts.port or 6379):
        need(
            "Redis",
            f"nothing listens at {parts.hostname}:{parts.port or 6379}; start redis-server or set OUTRELAY_REDIS_URL",
        )
    return url


class OwnRedis:
    """A private redis-server (AOF on) that a test may kill and restart."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--save",
                "",
                "--dir",
                str(self.dir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_port("127.0.0.1", self.port, 10):
            raise RuntimeError(f"redis-server did not listen on port {self.port}")

    def kill(self) -> None:
        """kill -9: no shutdown save, no goodbye to clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A private redis-server on a free port, killed at the end of the test."""
    if shutil.which("redis-server") is None:
        need("redis-server", "the binary is not on PATH (apt-get install redis-server)")
    server = OwnRedis(tmp_path / "redis")
    server.dir.mkdir()
    server.start()
    try:
        yield server
    finally:
        server.kill()
