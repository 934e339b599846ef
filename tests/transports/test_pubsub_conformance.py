"""The shared conformance suite against the official Google Cloud Pub/Sub emulator."""

from __future__ import annotations

import asyncio

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.transports.pubsub._config import PubSubConfig
from outrelay.transports.pubsub._transport import PubSubTransport
from tests.peers.pubsub_emulator import PROJECT, create_topic
from tests.services import free_port


class TestPubSubConformance(ConformanceSuite):
    """Every check of the suite, a topic of its own per check, ordering keys on."""

    @pytest.fixture
    def conformance_target(self, pubsub_emulator: str) -> ConformanceTarget:
        async def provision(name: str) -> str:
            await asyncio.to_thread(create_topic, pubsub_emulator, name)
            return name

        def make(topic: str, host: str) -> PubSubTransport:
            cfg = PubSubConfig(project=PROJECT, topic=topic, emulator_host=host, open_timeout=2.0, publish_timeout=8.0)
            return PubSubTransport(cfg, destination="conformance")

        return ConformanceTarget(
            make_transport=lambda topic: make(topic, pubsub_emulator),
            provision=provision,
            make_unreachable=lambda topic: make(topic, f"127.0.0.1:{free_port()}"),
            label="pubsub (official Cloud Pub/Sub emulator)",
            read_timeout=15.0,
            timeout=20.0,
        )
