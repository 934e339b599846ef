"""End to end: SQLite outbox → Relay → SQS (moto) → reader, including throttling.

moto's SQS receive and delete cost O(queue length) per message, so against
moto the runs use ``OUTRELAY_AWS_E2E_EVENTS`` events (default 500 over 50
streams, a few seconds); set it to 5000 for the full run (about a minute on
moto, seconds on real SQS).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from outrelay.core.contract.transport import Reader
from outrelay.transports.aws._sqs import SQSConfig, SQSTransport
from tests.peers._relay import relay_round_trip
from tests.peers.moto import ThrottlingProxy, aws_client, aws_options, unique

EVENTS = int(os.environ.get("OUTRELAY_AWS_E2E_EVENTS", "500"))


def make_queue(endpoint: str, fifo: bool) -> str:
    name = unique("e2e") + (".fifo" if fifo else "")
    attrs = {"FifoQueue": "true"} if fifo else {}
    return str(aws_client("sqs", endpoint).create_queue(QueueName=name, Attributes=attrs)["QueueUrl"])


def reader_for(endpoint: str, queue_url: str) -> Reader:
    return SQSTransport(SQSConfig(queue_url=queue_url, **aws_options(endpoint))).reader(queue_url)


def destination(endpoint: str, queue_url: str) -> dict[str, object]:
    return {
        "transport": "sqs",
        "queue_url": queue_url,
        **aws_options(endpoint),
        "max_workers": 8,
        "batch_size": 100,
        "max_in_flight": 8,
        "retry": {"initial_delay": 0.05, "max_delay": 1.0},
    }


class TestSQSRelay:
    async def test_fifo_queue_keeps_every_stream_in_order(self, moto_endpoint: str, tmp_path: Path) -> None:
        """EVENTS events over 50 streams reach a FIFO queue once each, in exact per-stream order."""
        q = make_queue(moto_endpoint, fifo=True)
        rt = await relay_round_trip(
            tmp_path, destination(moto_endpoint, q), reader_for(moto_endpoint, q), events=EVENTS, read_timeout=90
        )
        assert rt.summary.remaining == 0 and rt.summary.dead_lettered == 0
        assert rt.missing() == set()
        assert len(rt.received) == len(rt.sent)
        assert rt.order_violations() == []

    async def test_standard_queue_delivers_everything(self, moto_endpoint: str, tmp_path: Path) -> None:
        """EVENTS events over 50 streams all reach a standard queue at least once."""
        q = make_queue(moto_endpoint, fifo=False)
        rt = await relay_round_trip(
            tmp_path, destination(moto_endpoint, q), reader_for(moto_endpoint, q), events=EVENTS, read_timeout=90
        )
        assert rt.summary.remaining == 0 and rt.summary.dead_lettered == 0
        assert rt.missing() == set()

    async def test_throttled_relay_backs_off_and_loses_nothing(self, moto_endpoint: str, tmp_path: Path) -> None:
        """With the first SendMessageBatch calls throttled, the relay retries and delivers all, in order."""
        if not moto_endpoint.startswith("http://127.0.0.1"):
            pytest.skip("the throttling proxy needs a plain-HTTP loopback endpoint")
        q = make_queue(moto_endpoint, fifo=True)
        async with ThrottlingProxy(moto_endpoint, 20) as proxy:
            rt = await relay_round_trip(
                tmp_path, destination(proxy.url, q), reader_for(moto_endpoint, q), events=500, streams=50
            )
        assert proxy.throttled == 20
        assert rt.summary.counts["d"]["retried"] > 0
        assert rt.summary.remaining == 0 and rt.summary.dead_lettered == 0
        assert rt.missing() == set() and rt.order_violations() == []
