"""End to end: SQLite outbox → Relay → SNS (moto) → subscribed SQS queue, including throttling.

Event counts as in ``test_sqs_relay`` (``OUTRELAY_AWS_E2E_EVENTS``, default
500 against moto; 5000 for the full run).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from outrelay.core.contract.transport import Reader
from outrelay.transports.aws._sns import SNSConfig, SNSTransport
from tests.peers._relay import relay_round_trip
from tests.peers.moto import ThrottlingProxy, aws_client, aws_options, unique

EVENTS = int(os.environ.get("OUTRELAY_AWS_E2E_EVENTS", "500"))


def make_topic(endpoint: str, fifo: bool) -> str:
    name = unique("e2e") + (".fifo" if fifo else "")
    attrs = {"FifoTopic": "true"} if fifo else {}
    return str(aws_client("sns", endpoint).create_topic(Name=name, Attributes=attrs)["TopicArn"])


def reader_for(endpoint: str, arn: str) -> Reader:
    return SNSTransport(SNSConfig(topic_arn=arn, **aws_options(endpoint))).reader(arn)


def destination(endpoint: str, arn: str) -> dict[str, object]:
    return {
        "transport": "sns",
        "topic_arn": arn,
        **aws_options(endpoint),
        "max_workers": 8,
        "batch_size": 100,
        "max_in_flight": 8,
        "retry": {"initial_delay": 0.05, "max_delay": 1.0},
    }


class TestSNSRelay:
    async def test_fifo_topic_keeps_every_stream_in_order(self, moto_endpoint: str, tmp_path: Path) -> None:
        """EVENTS events over 50 streams reach a FIFO subscription once each, in exact per-stream order."""
        arn = make_topic(moto_endpoint, fifo=True)
        rt = await relay_round_trip(
            tmp_path, destination(moto_endpoint, arn), reader_for(moto_endpoint, arn), events=EVENTS, read_timeout=90
        )
        assert rt.summary.remaining == 0 and rt.summary.dead_lettered == 0
        assert rt.missing() == set() and len(rt.received) == len(rt.sent)
        assert rt.order_violations() == []

    async def test_standard_topic_delivers_everything(self, moto_endpoint: str, tmp_path: Path) -> None:
        """EVENTS events over 50 streams all reach a standard topic's subscription at least once."""
        arn = make_topic(moto_endpoint, fifo=False)
        rt = await relay_round_trip(
            tmp_path, destination(moto_endpoint, arn), reader_for(moto_endpoint, arn), events=EVENTS, read_timeout=90
        )
        assert rt.summary.remaining == 0 and rt.summary.dead_lettered == 0
        assert rt.missing() == set()

    async def test_throttled_relay_backs_off_and_loses_nothing(self, moto_endpoint: str, tmp_path: Path) -> None:
        """With the first PublishBatch calls throttled, the relay retries and delivers all, in order."""
        if not moto_endpoint.startswith("http://127.0.0.1"):
            pytest.skip("the throttling proxy needs a plain-HTTP loopback endpoint")
        arn = make_topic(moto_endpoint, fifo=True)
        async with ThrottlingProxy(moto_endpoint, 20) as proxy:
            rt = await relay_round_trip(
                tmp_path, destination(proxy.url, arn), reader_for(moto_endpoint, arn), events=500, streams=50
            )
        assert proxy.throttled == 20 and rt.summary.counts["d"]["retried"] > 0
        assert rt.summary.remaining == 0 and rt.summary.dead_lettered == 0
        assert rt.missing() == set() and rt.order_violations() == []
