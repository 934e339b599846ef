"""The conformance suite against the ``sqs`` transport (moto server, or ``OUTRELAY_AWS_ENDPOINT_URL``).

Only a FIFO queue is certified in the default run (each suite costs about a
minute on moto); ``target_for(endpoint, fifo=False)`` certifies a standard
queue, where the ordering and dedupe checks skip by capability (all other
checks passed there when last run).
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import STRUCTURED
from outrelay.transports.sqs._transport import SQSConfig, SQSTransport
from tests.peers.moto import aws_client, aws_options


def target_for(endpoint: str, *, fifo: bool) -> ConformanceTarget:
    async def provision(name: str) -> str:
        queue = name.replace("_", "-")[:70] + (".fifo" if fifo else "")
        attrs = {"FifoQueue": "true"} if fifo else {}

        def create() -> str:
            return str(aws_client("sqs", endpoint).create_queue(QueueName=queue, Attributes=attrs)["QueueUrl"])

        return await asyncio.to_thread(create)

    parts = urlsplit(endpoint)

    return ConformanceTarget(
        make_transport=lambda url: SQSTransport(SQSConfig(queue_url=url, **aws_options(endpoint))),
        provision=provision,
        make_unreachable=lambda url: SQSTransport(
            SQSConfig(queue_url=url, **aws_options("http://127.0.0.1:1"), connect_timeout=1)
        ),
        label=f"sqs {'FIFO' if fifo else 'standard'} queue on {endpoint} (moto unless OUTRELAY_AWS_ENDPOINT_URL)",
        read_timeout=10.0,
        binding=STRUCTURED,
        upstream=lambda url: (parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)),
        make_transport_via=lambda url, host, port: SQSTransport(
            SQSConfig(queue_url=url, **aws_options(f"http://{host}:{port}"), connect_timeout=1, read_timeout=3)
        ),
    )


class TestSQSFifoConformance(ConformanceSuite):
    @pytest.fixture
    def conformance_target(self, moto_endpoint: str) -> ConformanceTarget:
        return target_for(moto_endpoint, fifo=True)
