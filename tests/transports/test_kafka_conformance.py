"""The shared conformance suite against a real Kafka-API broker (tansu, or OUTRELAY_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from tests.peers.kafka import KafkaPeer, new_topic
from tests.services import free_port


class TestKafkaConformance(ConformanceSuite):
    """Every check of the suite, one fresh 4-partition topic per check."""

    @pytest.fixture
    def conformance_target(self, kafka_peer: KafkaPeer) -> ConformanceTarget:
        async def provision(name: str) -> str:
            return await new_topic(kafka_peer, prefix="conf")

        def make(topic: str, bootstrap: str) -> KafkaTransport:
            opts = kafka_peer.options(topic, bootstrap_servers=bootstrap, connect_timeout=3.0, request_timeout=8.0)
            return KafkaTransport(KafkaConfig.model_validate(opts), destination="conformance")

        return ConformanceTarget(
            make_transport=lambda topic: make(topic, kafka_peer.bootstrap),
            provision=provision,
            make_unreachable=lambda topic: make(topic, f"127.0.0.1:{free_port()}"),
            label=kafka_peer.label,
            read_timeout=10.0,
        )
