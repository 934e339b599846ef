"""The shared conformance suite against the official Google Cloud Pub/Sub emulator.

The emulator has no authentication and no permission checks, and the transport sends it no
credentials (``tests/peers/pubsub_emulator.py``): ``secret_never_leaks`` and the two forbidden
checks skip, saying which of those they lack.
"""

from __future__ import annotations

import asyncio

import pytest

from outrelay.conformance import Binding, ConformanceSuite, ConformanceTarget
from outrelay.transports.pubsub._config import PubSubConfig
from outrelay.transports.pubsub._transport import PubSubTransport
from tests.peers.conformance_hooks import VIA_TIMEOUT, skip_checks
from tests.peers.pubsub_emulator import NO_AUTH, PROJECT, create_topic
from tests.services import free_port

#: binary mode as Google's Pub/Sub binding: ``ce-*`` attributes (UTF-8, not percent-encoded), ``content-type``
PUBSUB_BINDING = Binding("pubsub", prefix="ce-", content_type_header="content-type")


class TestPubSubConformance(ConformanceSuite):
    """Every check of the suite, a topic of its own per check, ordering keys on."""

    @pytest.fixture(autouse=True)
    def _no_credentials(self, request: pytest.FixtureRequest) -> None:
        skip_checks(request, NO_AUTH)

    @pytest.fixture
    def conformance_target(self, pubsub_emulator: str) -> ConformanceTarget:
        async def provision(name: str) -> str:
            await asyncio.to_thread(create_topic, pubsub_emulator, name)
            return name

        def make(topic: str, host: str, wait: float | None = None) -> PubSubTransport:
            """``wait``: open_timeout and publish_timeout (else 2 s and 8 s) for the fault checks' transports."""
            cfg = PubSubConfig(
                project=PROJECT,
                topic=topic,
                emulator_host=host,
                open_timeout=wait or 2.0,
                publish_timeout=wait or 8.0,
            )
            return PubSubTransport(cfg, destination="conformance")

        host, _, port = pubsub_emulator.rpartition(":")
        return ConformanceTarget(
            make_transport=lambda topic: make(topic, pubsub_emulator),
            provision=provision,
            make_unreachable=lambda topic: make(topic, f"127.0.0.1:{free_port()}", wait=VIA_TIMEOUT),
            unsupported={
                "throttle": "the emulator never throttles, and Pub/Sub's RESOURCE_EXHAUSTED carries no retry hint",
                "refuse_target": (
                    "a missing topic is NOT_FOUND, retryable by design (an operator creates it); nothing else refuses"
                    " per message on the emulator"
                ),
                "late_reader": (
                    "a topic keeps a message only for the subscriptions that exist when it is published, and the "
                    "reader creates its subscription when it starts"
                ),
            },
            label="pubsub (official Cloud Pub/Sub emulator: no authentication, no IAM checks)",
            read_timeout=15.0,
            timeout=20.0,
            binding=PUBSUB_BINDING,
            upstream=lambda topic: (host or "127.0.0.1", int(port)),
            make_transport_via=lambda topic, h, p: make(topic, f"{h}:{p}", wait=VIA_TIMEOUT),
        )
