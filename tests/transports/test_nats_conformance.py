"""The shared conformance suite against a real NATS JetStream server."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.transports.nats._config import NatsConfig, StreamSpec
from outrelay.transports.nats._transport import NatsTransport
from tests.peers.nats import StreamFactory
from tests.services import free_port


class TestNatsConformance(ConformanceSuite):
    """Every check of the suite, one target (a stream of its own) per check."""

    @pytest.fixture
    async def conformance_target(self, nats_url: str) -> AsyncIterator[ConformanceTarget]:
        streams = StreamFactory(nats_url)
        names: dict[str, str] = {}  # subject -> stream

        async def provision(name: str) -> str:
            stream, prefix = await streams("conf", duplicate_window=120)
            subject = f"{prefix}.events"
            names[subject] = stream
            return subject

        def make(subject: str, servers: tuple[str, ...]) -> NatsTransport:
            # create_stream names the provisioned stream (it exists: nothing is created) so that its
            # duplicate window is declared before open(); open() then reads the real one.
            spec = StreamSpec(name=names.get(subject, "ORC_" + uuid.uuid4().hex[:8].upper()), subjects=(subject,))
            return NatsTransport(
                NatsConfig(servers=servers, subject=subject, create_stream=spec, connect_timeout=1, ack_timeout=3),
                destination="conformance",
            )

        yield ConformanceTarget(
            make_transport=lambda subject: make(subject, (nats_url,)),
            provision=provision,
            make_unreachable=lambda subject: make(subject, (f"nats://127.0.0.1:{free_port()}",)),
            label="nats (real nats-server 2.9 with JetStream)",
            read_timeout=10.0,
        )
        await streams.delete_all()
