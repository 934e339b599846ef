"""The shared conformance suite for the ``servicebus`` transport.

Against the AMQP 1.0 wire-protocol test peer (not Azure Service Bus): it
proves the wire mapping through the real azure-servicebus SDK, not Service
Bus itself. With OUTRELAY_SERVICEBUS_CONNECTION_STRING the same checks run
against a real namespace or the official emulator: the checks then share the
queues named by OUTRELAY_SERVICEBUS_SESSION_QUEUE (sessions and duplicate
detection on), drained before each check. (A plain-queue run of the suite
passes too but doubles the runtime; the non-session path is covered in
test_servicebus.py.)

``throttle_retry_after`` skips saying why: Service Bus's ``server-busy``
error carries no retry-hint field, and the azure-servicebus SDK surfaces
none, so the check's "the broker's hint reaches RetryLater" has nothing to
compare with. The transport suggests its ``busy_retry_after`` option
instead; test_servicebus.py (``TestFailures``) checks that mapping
against the test peer's server-busy answers.
"""

from __future__ import annotations

import gc
import warnings
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import AMQP
from outrelay.transports.servicebus._config import ServiceBusConfig
from outrelay.transports.servicebus._transport import ServiceBusTransport
from tests.peers.amqp_servicebus_peer import ServiceBusEnv, connection_string
from tests.peers.conformance_hooks import VIA_TIMEOUT, skip_checks
from tests.services import free_port

NO_BROKER_HINT = (
    "Service Bus's server-busy answer carries no retry-hint field (the SDK surfaces none): the transport "
    "suggests its busy_retry_after option, tested in test_servicebus.py::TestFailures"
)


def _endpoint(conn: str) -> tuple[str, int]:
    """``(host, port)`` of a connection string's ``Endpoint=sb://host[:port]`` (5671, AMQPS, without a port)."""
    fields = dict(part.split("=", 1) for part in conn.split(";") if "=" in part)
    parts = urlsplit(fields["Endpoint"])
    return parts.hostname or "127.0.0.1", parts.port or 5671


def _target(env: ServiceBusEnv, *, sessions: bool) -> ConformanceTarget:
    async def provision(name: str) -> str:
        return await env.provision(name, sessions=sessions, dedupe=sessions)

    def make(queue: str, conn: str, *, open_timeout: float = 5.0, send_timeout: float = 10.0) -> ServiceBusTransport:
        cfg = ServiceBusConfig(
            connection_string=conn,
            queue=queue,
            sessions=sessions,
            duplicate_detection=sessions,
            dedupe_window=env.dedupe_window,
            open_timeout=open_timeout,
            send_timeout=send_timeout,
        )
        return ServiceBusTransport(cfg, destination="conformance")

    kind = "sessions + duplicate detection" if sessions else "plain queue"
    return ConformanceTarget(
        unsupported=dict.fromkeys(
            ("secret", "make_forbidden", "refuse_target"),
            "the AMQP test peer has no authentication and no entity policies (the credential mapping is unit-tested "
            "in test_servicebus.py)",
        ),
        make_transport=lambda queue: make(queue, env.connection_string),
        provision=provision,
        make_unreachable=lambda queue: make(queue, connection_string(free_port())),
        label=f"{env.label}, {kind}",
        read_timeout=15.0,
        timeout=20.0,
        binding=AMQP,
        # through the suite's proxy only against the plain-AMQP test peer: a namespace speaks AMQPS (TLS with SNI)
        upstream=(lambda queue: _endpoint(env.connection_string)) if env.peer is not None else None,
        make_transport_via=lambda queue, host, port: make(
            queue, connection_string(port), open_timeout=VIA_TIMEOUT, send_timeout=VIA_TIMEOUT
        ),  # a stalled or black-holed send costs each fault check send_timeout
    )


class TestServiceBusConformance(ConformanceSuite):
    """Every check against a queue that requires sessions and detects duplicates (FIFO per stream, dedupe)."""

    @pytest.fixture
    def conformance_target(self, servicebus_env: ServiceBusEnv) -> ConformanceTarget:
        return _target(servicebus_env, sessions=True)

    @pytest.fixture(autouse=True)
    def _no_throttle_hint(self, request: pytest.FixtureRequest) -> None:
        skip_checks(request, {"throttle_retry_after": NO_BROKER_HINT})

    @pytest.fixture(autouse=True)
    def _no_unclosed_sockets(self) -> Iterator[None]:
        """Detects leaks, hides none: garbage is collected right after each check, and a ResourceWarning
        (a socket the transport left open) fails that check instead of whichever test runs next."""
        yield
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gc.collect()
        leaks = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert not leaks, f"the check left {len(leaks)} socket(s) unclosed, e.g. {leaks[0]}"
