"""Shared test configuration.

Tests that need a broker or emulator call :func:`tests.services.need` with
the reason; without the service they skip, but with
``OUTRELAY_REQUIRE_SERVICES=1`` (set by CI) the skip becomes a failure, so a
green CI means every service test ran.
"""

from __future__ import annotations

import pytest

from outrelay.transports.memory import MemoryTransport

# tests.hang_report: where a hanging test waits (see pyproject.toml's timeout). Then the real peers'
# fixtures, registered once so each session-scoped peer (tansu, moto, pulsar-lite, the Pub/Sub emulator,
# the AMQP test peer) starts once per test session, not once per module.
pytest_plugins = [
    "tests.hang_report",
    "tests.peers.amqp_servicebus_peer",
    "tests.peers.kafka",
    "tests.peers.moto",
    "tests.peers.nats",
    "tests.peers.proxy",
    "tests.peers.pubsub_emulator",
    "tests.peers.pulsar",
    "tests.peers.rabbitmq",
    "tests.peers.redis",
]


@pytest.fixture(autouse=True)
def _fresh_memory_brokers() -> None:
    """Each test starts with empty in-memory brokers."""
    MemoryTransport._brokers.clear()
