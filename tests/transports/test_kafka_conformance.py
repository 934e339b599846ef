"""The shared conformance suite against a real Kafka-API broker (tansu, or OUTRELAY_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import KAFKA
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from tests.peers.conformance_hooks import skip_fault_checks
from tests.peers.kafka import KafkaPeer, new_topic
from tests.services import free_port


class TestKafkaConformance(ConformanceSuite):
    """Every check of the suite, one fresh 4-partition topic per check."""

    @pytest.fixture(autouse=True)
    def _no_fault_proxy(self, request: pytest.FixtureRequest) -> None:
        # A Kafka client bootstraps, then connects to the listener the broker advertises in its
        # metadata; tansu advertises the fixed --advertised-listener-url it was started with, and the
        # suite's proxy listens on a port of its own choosing per check, so the producer would bypass it.
        skip_fault_checks(request, "Kafka clients reconnect to the broker's advertised listener, bypassing the proxy")

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
            binding=KAFKA,
        )
