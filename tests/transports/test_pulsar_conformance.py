"""The conformance suite against the ``pulsar`` transport (pulsar-lite, or ``OUTRELAY_PULSAR_URL``).

pulsar-lite has no broker deduplication, so the transport runs with
``deduplication = false`` (the dedupe check skips, by capability) unless
``OUTRELAY_PULSAR_DEDUP=1`` declares that the external namespace has it.
"""

from __future__ import annotations

import re

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.transports.pulsar._transport import PulsarConfig, PulsarTransport
from tests.peers.pulsar import pulsar_dedup


def target_for(url: str) -> ConformanceTarget:
    dedup = pulsar_dedup()

    async def provision(name: str) -> str:
        return "persistent://public/default/" + re.sub(r"[^A-Za-z0-9_.-]", "-", name)

    return ConformanceTarget(
        make_transport=lambda t: PulsarTransport(PulsarConfig(service_url=url, topic=t, deduplication=dedup)),
        provision=provision,
        make_unreachable=lambda t: PulsarTransport(
            PulsarConfig(service_url="pulsar://127.0.0.1:1", topic=t, connect_timeout=1, operation_timeout=2)
        ),
        label=f"pulsar at {url} (pulsar-lite unless OUTRELAY_PULSAR_URL)",
    )


class TestPulsarConformance(ConformanceSuite):
    @pytest.fixture
    def conformance_target(self, pulsar_url: str) -> ConformanceTarget:
        return target_for(pulsar_url)
