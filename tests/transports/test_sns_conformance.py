"""The conformance suite against the ``sns`` transport (moto server, or ``OUTRELAY_AWS_ENDPOINT_URL``).

The reader is an SQS queue of its own subscribed to the topic with raw message delivery.
Only a FIFO topic is certified here: the standard-topic path differs only in
leaving out the FIFO fields, which the SQS standard-queue suite and
``test_sns.py`` cover; moto makes each suite run cost about a minute.

Credentials: every transport is configured with one secret access key (the
``secret`` the suite greps for). ``make_forbidden`` publishes through a
private moto server that enforces IAM (``moto_iam``), as a user that may read
the topic but not publish to it; :class:`TestForbiddenPeer` shows that this
server tells the two users apart, so the forbidden checks fail for lack of
permission and not for a broken setup.
"""

from __future__ import annotations

import asyncio
from urllib.parse import urlsplit

import pytest

from outrelay import Delivered, Event, Message, Rejected
from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import STRUCTURED
from outrelay.transports.aws._errors import DeniedError
from outrelay.transports.aws._sns import SNSConfig, SNSTransport
from tests.peers.conformance_hooks import VIA_TIMEOUT
from tests.peers.moto import IAMMoto, aws_client, aws_options, require_iam, skip_why, suite_secret, user_options


def as_user(iam: IAMMoto, user: tuple[str, str]) -> SNSTransport:
    """A transport publishing to the private server's FIFO topic with ``user``'s keys."""
    return SNSTransport(SNSConfig(topic_arn=iam.topic_arn, **user_options(iam, user)), destination="conformance")


def target_for(endpoint: str, *, fifo: bool, iam: IAMMoto | str) -> ConformanceTarget:
    async def provision(name: str) -> str:
        topic = name.replace("_", "-")[:70] + (".fifo" if fifo else "")
        attrs = {"FifoTopic": "true"} if fifo else {}

        def create() -> str:
            return str(aws_client("sns", endpoint).create_topic(Name=topic, Attributes=attrs)["TopicArn"])

        return await asyncio.to_thread(create)

    parts = urlsplit(endpoint)
    secret = suite_secret(iam)

    def make(url: str, at: str, **timeouts: float) -> SNSTransport:
        return SNSTransport(SNSConfig(topic_arn=url, **aws_options(at, secret=secret or "testing"), **timeouts))

    return ConformanceTarget(
        make_transport=lambda url: make(url, endpoint),
        provision=provision,
        make_unreachable=lambda url: make(url, "http://127.0.0.1:1", connect_timeout=1),
        label=f"sns {'FIFO' if fifo else 'standard'} topic on {endpoint} (moto unless OUTRELAY_AWS_ENDPOINT_URL)",
        read_timeout=10.0,
        binding=STRUCTURED,
        upstream=lambda url: (parts.hostname or "127.0.0.1", parts.port or (443 if parts.scheme == "https" else 80)),
        make_transport_via=lambda url, host, port: make(
            url, f"http://{host}:{port}", connect_timeout=1, read_timeout=VIA_TIMEOUT
        ),
        # the denied user publishes to the private server's own topic: the suite's target lives on the shared one
        make_forbidden=(lambda url: as_user(iam, iam.denied)) if isinstance(iam, IAMMoto) else None,
        secret=secret,
        unsupported={
            "late_reader": (
                "a topic keeps nothing: a message persists in the queues subscribed when it is published, and the "
                "reader subscribes its queue when it starts"
            )
        },
    )


class TestSNSFifoConformance(ConformanceSuite):
    @pytest.fixture(autouse=True)
    def _why_skipped(self, request: pytest.FixtureRequest, moto_iam: IAMMoto | str) -> None:
        skip_why(request, moto_iam)

    @pytest.fixture
    def conformance_target(self, moto_endpoint: str, moto_iam: IAMMoto | str) -> ConformanceTarget:
        return target_for(moto_endpoint, fifo=True, iam=moto_iam)


class TestForbiddenPeer:
    async def test_users_told_apart(self, moto_iam: IAMMoto | str) -> None:
        """On the IAM-enforcing server the allowed user publishes, and the read-only user is refused the
        publish itself (AccessDenied, not unknown credentials): check() fails, send() rejects and disables."""
        iam = require_iam(moto_iam)
        allowed, denied = as_user(iam, iam.allowed), as_user(iam, iam.denied)
        ev = Event(type="t", stream="s", data=b"x")
        assert "was not refused" in await allowed.check()
        await allowed.open()
        assert await allowed.send([Message(ev, iam.topic_arn, ev.stream)]) == [Delivered()]
        await allowed.close()
        with pytest.raises(DeniedError, match=r"PublishBatch .*permission denied.*AccessDenied") as info:
            await denied.check()
        assert info.value.code == "AccessDenied"
        await denied.open()  # reading the topic is allowed
        [result] = await denied.send([Message(ev, iam.topic_arn, ev.stream)])
        await denied.close()
        assert isinstance(result, Rejected) and result.disable_destination and "AccessDenied" in result.reason
