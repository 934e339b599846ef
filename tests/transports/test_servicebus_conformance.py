"""The shared conformance suite for the ``servicebus`` transport.

Against the AMQP 1.0 wire-protocol test peer (not Azure Service Bus): it
proves the wire mapping through the real azure-servicebus SDK, not Service
Bus itself. With OUTRELAY_SERVICEBUS_CONNECTION_STRING the same checks run
against a real namespace or the official emulator: the checks then share the
queues named by OUTRELAY_SERVICEBUS_SESSION_QUEUE (sessions and duplicate
detection on), drained before each check. (A plain-queue run of the suite
passes too but doubles the runtime; the non-session path is covered in
test_servicebus.py.)
"""

from __future__ import annotations

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.transports.servicebus._config import ServiceBusConfig
from outrelay.transports.servicebus._transport import ServiceBusTransport
from tests.peers.amqp_servicebus_peer import ServiceBusEnv, connection_string
from tests.services import free_port


def _target(env: ServiceBusEnv, *, sessions: bool) -> ConformanceTarget:
    async def provision(name: str) -> str:
        return await env.provision(name, sessions=sessions, dedupe=sessions)

    def make(queue: str, conn: str) -> ServiceBusTransport:
        cfg = ServiceBusConfig(
            connection_string=conn,
            queue=queue,
            sessions=sessions,
            duplicate_detection=sessions,
            dedupe_window=env.dedupe_window,
            open_timeout=5.0,
            send_timeout=10.0,
        )
        return ServiceBusTransport(cfg, destination="conformance")

    kind = "sessions + duplicate detection" if sessions else "plain queue"
    return ConformanceTarget(
        make_transport=lambda queue: make(queue, env.connection_string),
        provision=provision,
        make_unreachable=lambda queue: make(queue, connection_string(free_port())),
        label=f"{env.label}, {kind}",
        read_timeout=15.0,
        timeout=20.0,
    )


class TestServiceBusConformance(ConformanceSuite):
    """Every check against a queue that requires sessions and detects duplicates (FIFO per stream, dedupe)."""

    @pytest.fixture
    def conformance_target(self, servicebus_env: ServiceBusEnv) -> ConformanceTarget:
        return _target(servicebus_env, sessions=True)
