"""The ``sns`` transport against moto in server mode (or ``OUTRELAY_AWS_ENDPOINT_URL``)."""

from __future__ import annotations

import time
from typing import Any

import pytest

from outrelay import Delivered, Event, Message, Registry, Rejected, RetryableError, RetryLater, UsageError
from outrelay.core.model.errors import TransportError
from outrelay.transports.aws._sns import SNSConfig, SNSTransport
from tests.peers.moto import ThrottlingProxy, aws_client, aws_options, unique


def make_topic(endpoint: str, fifo: bool = False) -> str:
    name = unique("t") + (".fifo" if fifo else "")
    attrs = {"FifoTopic": "true"} if fifo else {}
    return str(aws_client("sns", endpoint).create_topic(Name=name, Attributes=attrs)["TopicArn"])


def transport(endpoint: str, topic_arn: str, **extra: Any) -> SNSTransport:
    return SNSTransport(SNSConfig(topic_arn=topic_arn, **aws_options(endpoint), **extra))


def msgs(t: SNSTransport, events: list[Event]) -> list[Message]:
    return [Message(e, t.target(e), e.stream) for e in events]


def loopback(endpoint: str) -> None:
    if not endpoint.startswith("http://127.0.0.1"):
        pytest.skip("the proxy needs a plain-HTTP loopback endpoint")


class TestSNSTransport:
    async def test_round_trip_through_subscribed_queue(self, moto_endpoint: str) -> None:
        """Published events reach a raw-delivery SQS subscription as equal Events with filter attributes."""
        arn = make_topic(moto_endpoint)
        t = transport(moto_endpoint, arn)
        await t.open()
        events = [Event(type="order.created", stream="s", data={"i": i}, tenant="acme") for i in range(3)]
        async with t.reader(arn) as reader:
            assert await t.send(msgs(t, events)) == [Delivered()] * 3
            got = await reader.read(3, 5)
        await t.close()
        assert {r.event.id: r.event for r in got} == {e.id: e for e in events}
        assert got[0].headers["type"] == "order.created" and got[0].headers["tenant"] == "acme"
        assert got[0].target == arn

    async def test_fifo_topic_groups_by_stream_and_dedupes(self, moto_endpoint: str) -> None:
        """A FIFO topic gets MessageGroupId = stream and drops a re-sent event id."""
        arn = make_topic(moto_endpoint, fifo=True)
        t = transport(moto_endpoint, arn)
        caps = t.capabilities
        assert (caps.ordering_by_key, caps.ordered_batches, caps.native_dedupe, caps.dedupe_window) == (
            True,
            False,
            True,
            300.0,
        )
        await t.open()
        ev = Event(type="t", stream="stream-7", data=b"x")
        async with t.reader(arn) as reader:
            assert await t.send(msgs(t, [ev])) == [Delivered()]
            assert await t.send(msgs(t, [ev])) == [Delivered()]
            got = await reader.read(2, 2)
        await t.close()
        assert [(r.event.id, r.key) for r in got] == [(ev.id, "stream-7")]

    async def test_batches_chunked_by_ten(self, moto_endpoint: str) -> None:
        """25 messages go out as three PublishBatch requests."""
        loopback(moto_endpoint)
        arn = make_topic(moto_endpoint)
        async with ThrottlingProxy(moto_endpoint, 0) as proxy:
            t = transport(proxy.url, arn)
            await t.open()
            before = proxy.passed
            events = [Event(type="t", stream=f"s{i}") for i in range(25)]
            assert await t.send(msgs(t, events)) == [Delivered()] * 25
            assert proxy.passed - before == 3
            await t.close()

    async def test_failed_entry_rejected_neighbours_delivered(self, moto_endpoint: str) -> None:
        """A Failed entry with SenderFault (too long) is Rejected; the rest of its batch is delivered."""
        arn = make_topic(moto_endpoint)
        # Raise our own limit so the service itself judges the size.
        t = transport(moto_endpoint, arn, message_limit=1_048_576)
        await t.open()
        big = Event(type="t", stream="b", data="x" * 300_000)
        events = [Event(type="t", stream="a"), big, Event(type="t", stream="c")]
        results = await t.send(msgs(t, events))
        await t.close()
        assert results[0] == Delivered() and results[2] == Delivered()
        assert isinstance(results[1], Rejected) and "InvalidParameter" in results[1].reason

    async def test_oversized_rejected_before_sending(self, moto_endpoint: str) -> None:
        """Data above max_message_bytes is Rejected without a request."""
        t = transport(moto_endpoint, make_topic(moto_endpoint))
        await t.open()
        limit = t.capabilities.max_message_bytes
        assert limit is not None
        results = await t.send(msgs(t, [Event(type="t", stream="a", data=b"x" * (limit + 1))]))
        await t.close()
        assert isinstance(results[0], Rejected)

    async def test_throttling_is_retry_later(self, moto_endpoint: str) -> None:
        """A throttled PublishBatch (query-protocol Throttling) yields RetryLater."""
        loopback(moto_endpoint)
        arn = make_topic(moto_endpoint)
        async with ThrottlingProxy(moto_endpoint, 1) as proxy:
            t = transport(proxy.url, arn)
            await t.open()
            ev = [Event(type="t", stream="s")]
            first = await t.send(msgs(t, ev))
            assert isinstance(first[0], RetryLater) and "Throttling" in first[0].error
            assert await t.send(msgs(t, ev)) == [Delivered()]
            await t.close()

    async def test_missing_topic_is_retryable(self, moto_endpoint: str) -> None:
        """A topic that does not exist fails open retryably (an operator must create it)."""
        with pytest.raises(RetryableError, match="NotFound"):
            await transport(moto_endpoint, make_topic(moto_endpoint) + "-missing").open()

    async def test_lifecycle_and_check(self, moto_endpoint: str) -> None:
        """check() is one line; close is idempotent; send after close raises; a dead endpoint fails fast."""
        t = transport(moto_endpoint, make_topic(moto_endpoint, fifo=True))
        line = await t.check()
        assert "FIFO topic" in line and "\n" not in line
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send([])
        down = transport("http://127.0.0.1:1", "arn:aws:sns:us-east-1:123456789012:x")
        started = time.monotonic()
        with pytest.raises(RetryableError):
            await down.open()
        with pytest.raises(TransportError, match="exists"):
            await down.check()
        assert time.monotonic() - started < 5

    def test_registered_and_secret_hidden(self) -> None:
        """The registry builds the transport; the secret key never shows in its repr."""
        t = Registry().create_transport("sns", {"topic_arn": "arn:x", "secret_access_key": "s3cr3t"}, destination="d")
        assert isinstance(t, SNSTransport) and "s3cr3t" not in repr(t.config)
