"""A private 6-process Redis Cluster (3 primaries, 3 replicas) on loopback, for the cluster tests.

:class:`RedisClusterPeer` starts ``redis-server --cluster-enabled yes`` six times on free
ports (client port and cluster-bus port both picked, so the bus never lands above 65535),
joins them with ``redis-cli --cluster create ... --cluster-replicas 1 --cluster-yes``, and
waits until every node reports ``cluster_state:ok`` with all 16384 slots assigned. Nothing
is persisted (``--save '' --appendonly no``); the data directory is a temp dir.

Faults the tests fire: :meth:`RedisClusterPeer.failover` (``CLUSTER FAILOVER`` on a replica:
a coordinated failover, the replica catches up first, so acknowledged writes survive) and
:meth:`RedisClusterPeer.reshard` (``redis-cli --cluster reshard``: slots and their keys move
between primaries with ``MIGRATE``, clients see ``ASK``/``MOVED``/``TRYAGAIN`` meanwhile).

The session fixture :func:`redis_cluster` starts one cluster per test session and kills its
processes in a finalizer; without ``redis-server``/``redis-cli`` it skips (fails under
``OUTRELAY_REQUIRE_SERVICES=1``). :func:`redis_cluster_url` is ``OUTRELAY_REDIS_CLUSTER_URL``
(any node of an external cluster) when set, else a node of the private cluster; the fault
tests always use the private one.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from redis.crc import key_slot

from tests.services import free_port, need, wait_port

__all__ = ["RedisClusterPeer", "redis_cluster", "redis_cluster_url"]

NODES = 6
#: how long the cluster may take to form, fail over or settle (seconds)
SETTLE = 30.0


class RedisClusterPeer:
    """Six redis-server processes forming a cluster; see the module docstring."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.ports: list[int] = []
        self.procs: list[subprocess.Popen[bytes]] = []

    @property
    def url(self) -> str:
        """A seed node's URL (the client discovers the others)."""
        return f"redis://127.0.0.1:{self.ports[0]}"

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the six nodes and form the cluster. :raises RuntimeError: it did not form in time."""
        taken: set[int] = set()
        for _ in range(NODES):
            port, bus = _two_free_ports(taken)
            node_dir = self.dir / str(port)
            node_dir.mkdir(parents=True)
            self.ports.append(port)
            argv = ["redis-server", "--port", str(port), "--cluster-port", str(bus), "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                    "--cluster-node-timeout", "3000", "--save", "", "--appendonly", "no",
                    "--dir", str(node_dir), "--logfile", str(node_dir / "redis.log")]  # fmt: skip
            self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        for port in self.ports:
            if not wait_port("127.0.0.1", port, 10):
                raise RuntimeError(f"redis-server (cluster node) did not listen on port {port}")
        create = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{p}" for p in self.ports),
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, timeout=SETTLE, check=False,
        )  # fmt: skip
        if create.returncode != 0:
            tail = create.stdout.decode(errors="replace")[-500:]
            raise RuntimeError(f"redis-cli --cluster create failed ({create.returncode}): {tail}")
        self.wait_settled()

    def stop(self) -> None:
        """Kill every node (SIGKILL: nothing to save) and reap it."""
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGKILL)
        for proc in self.procs:
            proc.wait(10)
        self.procs.clear()

    # -- state -------------------------------------------------------------------------------------

    def client(self, port: int) -> redis.Redis:
        """A plain (non-cluster) client of one node, for control commands."""
        return redis.Redis(port=port, socket_timeout=5, decode_responses=True)

    def nodes(self) -> list[dict[str, str]]:
        """``CLUSTER NODES`` as seen by the first reachable node: id, port, role, primary (its primary's id)."""
        out: list[dict[str, str]] = []
        for line in self._ask_any("CLUSTER", "NODES").splitlines():
            node_id, addr, flags, primary = line.split()[:4]
            role = "primary" if "master" in flags.split(",") else "replica"
            out.append({"id": node_id, "port": addr.split("@")[0].rsplit(":", 1)[1], "role": role, "primary": primary})
        return out

    def primaries(self) -> list[dict[str, str]]:
        """The primaries that own slots (a demoted primary may still be flagged ``master`` with none)."""
        owning = {str(primary[1]) for _, _, primary, *_ in self._ask_any("CLUSTER", "SLOTS")}
        return [n for n in self.nodes() if n["role"] == "primary" and n["port"] in owning]

    def primary_of(self, key: str) -> int:
        """The port of the primary that owns ``key``'s slot now."""
        return self.owners([key])[key]

    def owners(self, keys: Iterable[str]) -> dict[str, int]:
        """The port of the primary that owns each key's slot now (one ``CLUSTER SLOTS``)."""
        ranges = [
            (int(start), int(end), int(primary[1])) for start, end, primary, *_ in self._ask_any("CLUSTER", "SLOTS")
        ]
        out: dict[str, int] = {}
        for key in keys:
            slot = key_slot(key.encode())
            out[key] = next(port for start, end, port in ranges if start <= slot <= end)
        return out

    def lowest_slots(self, port: int, count: int) -> set[int]:
        """The ``count`` lowest slots the primary at ``port`` owns now: those ``redis-cli --cluster
        reshard`` moves first from it (it takes a source's slots in ascending order)."""
        owned = sorted(
            slot
            for start, end, primary, *_ in self._ask_any("CLUSTER", "SLOTS")
            if int(primary[1]) == port
            for slot in range(int(start), int(end) + 1)
        )
        return set(owned[:count])

    def wait_settled(self, timeout: float = SETTLE) -> None:
        """Until every node says ``cluster_state:ok``, all slots are assigned, every replica is in sync
        with its primary (else ``CLUSTER FAILOVER`` refuses), no slot is migrating or importing, and all
        nodes agree on every node's role and on the slot map (else ``redis-cli --cluster`` may refuse).

        :raises RuntimeError: not within ``timeout``."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                maps = set()
                for port in self.ports:
                    with self.client(port) as c:
                        info = c.execute_command("CLUSTER", "INFO")
                        text = info if isinstance(info, str) else str(info)
                        if "cluster_state:ok" not in text or "cluster_slots_assigned:16384" not in text:
                            raise RuntimeError(f"node {port}: {text.splitlines()[0]}")
                        replication = c.info("replication")
                        if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                            raise RuntimeError(f"replica {port}: not in sync with its primary yet")
                        nodes = c.execute_command("CLUSTER", "NODES")
                        if "->-" in nodes or "-<-" in nodes:
                            raise RuntimeError(f"node {port}: a slot is still migrating")
                        roles = sorted((line.split()[0], "master" in line.split()[2]) for line in nodes.splitlines())
                        slot_map = sorted(tuple(map(str, s[:3])) for s in c.execute_command("CLUSTER", "SLOTS"))
                        maps.add((tuple(roles), tuple(slot_map)))
                if len(maps) == 1:
                    return
                last = "nodes disagree about the roles or the slot map"
            except (redis.RedisError, RuntimeError, OSError) as exc:
                last = str(exc)
            time.sleep(0.1)
        raise RuntimeError(f"the Redis Cluster did not settle within {timeout:g}s: {last}")

    def _ask_any(self, *command: str) -> Any:
        error: Exception | None = None
        for port in self.ports:
            try:
                with self.client(port) as c:
                    return c.execute_command(*command)
            except (redis.RedisError, OSError) as exc:
                error = exc
        raise RuntimeError(f"no cluster node answered {command[0]} {command[1]}: {error}")

    # -- faults ------------------------------------------------------------------------------------

    async def failover(self, primary_port: int) -> int:
        """``CLUSTER FAILOVER`` on a replica of the primary at ``primary_port``; returns the replica's
        port once it is the primary and the cluster has settled."""
        nodes = self.nodes()
        primary = next(n for n in nodes if n["port"] == str(primary_port))
        replica = next(n for n in nodes if n["primary"] == primary["id"])
        port = int(replica["port"])

        def run() -> None:
            with self.client(port) as c:
                c.execute_command("CLUSTER", "FAILOVER")
            deadline = time.monotonic() + SETTLE
            while time.monotonic() < deadline:
                with self.client(port) as c:
                    if c.execute_command("ROLE")[0] == "master":
                        break
                time.sleep(0.05)
            else:
                raise RuntimeError(f"replica {port} did not become primary within {SETTLE:g}s")
            self.wait_settled()

        await asyncio.to_thread(run)
        return port

    async def reshard(self, source_port: int, target_port: int, slots: int) -> None:
        """Move ``slots`` slots (the source's lowest, with their keys) from one primary to another
        with ``redis-cli --cluster reshard``; returns once the cluster has settled."""
        ids = {n["port"]: n["id"] for n in self.nodes()}
        proc = await asyncio.create_subprocess_exec(
            "redis-cli", "--cluster", "reshard", f"127.0.0.1:{source_port}",
            "--cluster-from", ids[str(source_port)], "--cluster-to", ids[str(target_port)],
            "--cluster-slots", str(slots), "--cluster-yes", "--cluster-pipeline", "100",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )  # fmt: skip
        out, _ = await asyncio.wait_for(proc.communicate(), SETTLE * 2)
        if proc.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster reshard failed ({proc.returncode}): {out.decode()[-500:]}")
        await asyncio.to_thread(self.wait_settled)


def _two_free_ports(taken: set[int]) -> tuple[int, int]:
    while True:
        port, bus = free_port(), free_port()
        if port != bus and not {port, bus} & taken:
            taken.update((port, bus))
            return port, bus


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterPeer]:
    """A private 6-node Redis Cluster for this test session (killed at its end)."""
    for binary in ("redis-server", "redis-cli"):
        if shutil.which(binary) is None:
            need("Redis Cluster", f"`{binary}` is not on PATH (apt-get install redis-server redis-tools)")
    peer = RedisClusterPeer(tmp_path_factory.mktemp("redis-cluster"))
    try:
        peer.start()
        yield peer
    finally:
        peer.stop()


@pytest.fixture(scope="session")
def redis_cluster_url(request: pytest.FixtureRequest) -> str:
    """``OUTRELAY_REDIS_CLUSTER_URL`` (a node of an external cluster), else a node of :func:`redis_cluster`."""
    external = os.environ.get("OUTRELAY_REDIS_CLUSTER_URL")
    if external:
        return external
    peer: RedisClusterPeer = request.getfixturevalue("redis_cluster")
    return peer.url
