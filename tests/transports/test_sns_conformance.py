"""The conformance suite against the ``sns`` transport (moto server, or ``OUTRELAY_AWS_ENDPOINT_URL``).

The reader is an SQS queue of its own subscribed to the topic with raw message delivery.
Only a FIFO topic is certified here: the standard-topic path differs only in
leaving out the FIFO fields, which the SQS standard-queue suite and
``test_sns.py`` cover; moto makes each suite run cost about a minute.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import STRUCTURED
from outrelay.transports.sns._transport import SNSConfig, SNSTransport
from tests.peers.moto import aws_client, aws_options


def target_for(endpoint: str, *, fifo: bool) -> ConformanceTarget:
    async def provision(name: str) -> str:
        topic = name.replace("_", "-")[:70] + (".fifo" if fifo else "")
        attrs = {"FifoTopic": "true"} if fifo else {}

        def create() -> str:
            return str(aws_client("sns", endpoint).create_topic(Name=topic, Attributes=attrs)["TopicArn"])

        return await asyncio.to_thread(create)

    parts = urlsplit(endpoint)

    return ConformanceTarget(
        make_transport=lambda url: SNSTransport(SNSConfig(topic_arn=url, **aws_options(endpoint))),
        provision=provision,
        make_unreachable=lambda url: SNSTransport(
            SNSConfig(topic_arn=url, **aws_options("http://127.0.0.1:1"), connect_timeout=1)
        ),
        label=f"sns {'FIFO' if fifo else 'standard'} topic on {endpoint} (moto unless OUTRELAY_AWS_ENDPOINT_URL)",
        read_timeout=10.0,
        binding=STRUCTURED,
        upstream=lambda url: (parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)),
        make_transport_via=lambda url, host, port: SNSTransport(
            SNSConfig(topic_arn=url, **aws_options(f"http://{host}:{port}"), connect_timeout=1, read_timeout=3)
        ),
    )


class TestSNSFifoConformance(ConformanceSuite):
    @pytest.fixture
    def conformance_target(self, moto_endpoint: str) -> ConformanceTarget:
        return target_for(moto_endpoint, fifo=True)
