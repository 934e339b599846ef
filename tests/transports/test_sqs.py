"""The ``sqs`` transport against moto in server mode (or ``OUTRELAY_AWS_ENDPOINT_URL``)."""

from __future__ import annotations

import asyncio
import hashlib
import time
from typing import Any

import pytest

from outrelay import ConfigError, Delivered, Event, Message, Registry, Rejected, RetryableError, RetryLater, UsageError
from outrelay.core.model.errors import TransportError
from outrelay.kit import NotSent, Progress, sending
from outrelay.transports.aws._sqs import SQSConfig, SQSTransport
from tests.peers.moto import ThrottlingProxy, aws_client, aws_options, unique


def make_queue(endpoint: str, fifo: bool = False) -> str:
    name = unique("q") + (".fifo" if fifo else "")
    attrs = {"FifoQueue": "true"} if fifo else {}
    return str(aws_client("sqs", endpoint).create_queue(QueueName=name, Attributes=attrs)["QueueUrl"])


def transport(endpoint: str, queue_url: str, **extra: Any) -> SQSTransport:
    return SQSTransport(SQSConfig(queue_url=queue_url, **aws_options(endpoint), **extra))


def msgs(t: SQSTransport, events: list[Event]) -> list[Message]:
    return [Message(e, t.target(e), e.stream) for e in events]


def receive_raw(endpoint: str, queue_url: str, n: int, wait: float = 10) -> list[dict[str, Any]]:
    sqs = aws_client("sqs", endpoint)
    out: list[dict[str, Any]] = []
    deadline = time.monotonic() + wait
    while len(out) < n and time.monotonic() < deadline:
        resp = sqs.receive_message(
            QueueUrl=queue_url, MaxNumberOfMessages=10, WaitTimeSeconds=1, MessageSystemAttributeNames=["All"]
        )
        for m in resp.get("Messages", []):
            out.append(m)
            sqs.delete_message(QueueUrl=queue_url, ReceiptHandle=m["ReceiptHandle"])
    return out


class TestSQSTransport:
    async def test_round_trip_rebuilds_event(self, moto_endpoint: str) -> None:
        """Events sent to a standard queue read back as equal Events, with filter attributes."""
        q = make_queue(moto_endpoint)
        t = transport(moto_endpoint, q)
        await t.open()
        events = [
            Event(type="order.created", stream="s1", data={"i": i}, tenant="acme", labels={"a": "b"}) for i in range(3)
        ]
        assert await t.send(msgs(t, events)) == [Delivered()] * 3
        async with t.reader(q) as reader:
            got = await reader.read(3, 5)
        await t.close()
        assert {r.event.id: r.event for r in got} == {e.id: e for e in events}
        assert got[0].headers["type"] == "order.created"
        assert got[0].headers["tenant"] == "acme"
        assert got[0].content_type == "application/cloudevents+json"

    async def test_fifo_maps_stream_and_id(self, moto_endpoint: str) -> None:
        """On a FIFO queue the stream is the MessageGroupId and the event id the MessageDeduplicationId."""
        q = make_queue(moto_endpoint, fifo=True)
        t = transport(moto_endpoint, q)
        caps = t.capabilities
        assert (caps.ordering_by_key, caps.ordered_batches, caps.native_dedupe, caps.dedupe_window) == (
            True,
            False,
            True,
            300.0,
        )
        await t.open()
        ev = Event(type="t", stream="stream-1", data=b"x")
        odd = Event(type="t", stream="has spaces é", data=b"y")
        assert await t.send(msgs(t, [ev, odd])) == [Delivered(), Delivered()]
        assert await t.send(msgs(t, [ev])) == [Delivered()]  # a re-send inside the window
        await t.close()
        got = receive_raw(moto_endpoint, q, 3, wait=2)
        attrs = {m["Attributes"]["MessageDeduplicationId"]: m["Attributes"]["MessageGroupId"] for m in got}
        assert len(got) == 2
        assert attrs[ev.id] == "stream-1"
        assert attrs[odd.id] == hashlib.sha256(odd.stream.encode()).hexdigest()

    async def test_standard_queue_declares_no_ordering(self, moto_endpoint: str) -> None:
        """A standard queue declares neither ordering nor dedupe."""
        caps = transport(moto_endpoint, make_queue(moto_endpoint)).capabilities
        assert not caps.ordering_by_key and not caps.native_dedupe and caps.dedupe_window is None

    async def test_batches_chunked_by_ten(self, moto_endpoint: str) -> None:
        """25 messages go out as three SendMessageBatch requests and all arrive."""
        if not moto_endpoint.startswith("http://127.0.0.1"):
            pytest.skip("the counting proxy needs a plain-HTTP loopback endpoint")
        q = make_queue(moto_endpoint)
        async with ThrottlingProxy(moto_endpoint, 0) as proxy:
            t = transport(proxy.url, q)
            await t.open()
            before = proxy.passed
            events = [Event(type="t", stream=f"s{i}", data={"i": i}) for i in range(25)]
            assert await t.send(msgs(t, events)) == [Delivered()] * 25
            assert proxy.passed - before == 3
            await t.close()
        assert len(receive_raw(moto_endpoint, q, 25)) == 25

    async def test_batches_chunked_by_bytes(self, moto_endpoint: str) -> None:
        """Large messages are split so no request exceeds the service's 256 KiB."""
        if not moto_endpoint.startswith("http://127.0.0.1"):
            pytest.skip("the counting proxy needs a plain-HTTP loopback endpoint")
        q = make_queue(moto_endpoint)
        async with ThrottlingProxy(moto_endpoint, 0) as proxy:
            t = transport(proxy.url, q)
            await t.open()
            before = proxy.passed
            events = [Event(type="t", stream=f"s{i}", data="x" * 100_000) for i in range(4)]
            assert await t.send(msgs(t, events)) == [Delivered()] * 4
            assert proxy.passed - before == 2
            await t.close()

    async def test_oversized_rejected_alone(self, moto_endpoint: str) -> None:
        """Data above max_message_bytes is Rejected; its neighbours are delivered."""
        q = make_queue(moto_endpoint)
        t = transport(moto_endpoint, q)
        await t.open()
        limit = t.capabilities.max_message_bytes
        assert limit is not None
        events = [Event(type="t", stream="a", data=b"x" * limit), Event(type="t", stream="b", data=b"x" * (limit + 1))]
        results = await t.send(msgs(t, events))
        await t.close()
        assert results[0] == Delivered()
        assert isinstance(results[1], Rejected)

    async def test_throttling_is_retry_later(self, moto_endpoint: str) -> None:
        """A throttled SendMessageBatch (RequestThrottled) yields RetryLater, then succeeds."""
        if not moto_endpoint.startswith("http://127.0.0.1"):
            pytest.skip("the throttling proxy needs a plain-HTTP loopback endpoint")
        q = make_queue(moto_endpoint)
        async with ThrottlingProxy(moto_endpoint, 1) as proxy:
            t = transport(proxy.url, q)
            await t.open()
            ev = [Event(type="t", stream="s", data=b"1")]
            first = await t.send(msgs(t, ev))
            assert isinstance(first[0], RetryLater) and "RequestThrottled" in first[0].error
            assert await t.send(msgs(t, ev)) == [Delivered()]
            await t.close()

    async def test_missing_queue_is_retryable(self, moto_endpoint: str) -> None:
        """A queue that does not exist fails open retryably (an operator must create it)."""
        t = transport(moto_endpoint, make_queue(moto_endpoint) + "-missing")
        with pytest.raises(RetryableError, match=r"NonExistentQueue|QueueDoesNotExist"):
            await t.open()

    async def test_delay_seconds(self, moto_endpoint: str) -> None:
        """delay_seconds holds a message back on a standard queue and is refused for FIFO queues."""
        with pytest.raises(ValueError, match="FIFO"):
            SQSConfig(queue_url="https://sqs.example/1/q.fifo", delay_seconds=5)
        q = make_queue(moto_endpoint)
        # 3 s, not 1: on a loaded machine starting the reader (a boto3 client) took most of a 1 s delay,
        # so the message was already visible when the first read ran (a CI failure, not an SQS one)
        t = transport(moto_endpoint, q, delay_seconds=3)
        await t.open()
        assert await t.send(msgs(t, [Event(type="t", stream="s")])) == [Delivered()]
        async with t.reader(q) as reader:
            assert await reader.read(1, 0.3) == []
            assert len(await reader.read(1, 8)) == 1
        await t.close()

    async def test_lifecycle(self, moto_endpoint: str) -> None:
        """close is idempotent, send after close raises UsageError, open against nothing fails fast."""
        t = transport(moto_endpoint, make_queue(moto_endpoint))
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send([])
        down = SQSTransport(SQSConfig(queue_url="http://127.0.0.1:1/1/q", **aws_options("http://127.0.0.1:1")))
        started = time.monotonic()
        with pytest.raises(RetryableError):
            await down.open()
        assert time.monotonic() - started < 5

    async def test_check(self, moto_endpoint: str) -> None:
        """check() returns one line for a reachable queue and a how-to-fix error otherwise."""
        t = transport(moto_endpoint, make_queue(moto_endpoint, fifo=True))
        line = await t.check()
        assert "FIFO queue" in line and "\n" not in line
        missing = transport(moto_endpoint, "http://127.0.0.1:1/1/nope")
        with pytest.raises(TransportError, match="exists"):
            await missing.check()

    async def test_progress_reported_per_request_and_deadline_kept(self, moto_endpoint: str) -> None:
        """Each request's outcomes are reported as it answers; past the deadline a later request of a
        key is not started (NotSent) and nothing of it reaches the queue."""
        q = make_queue(moto_endpoint)
        t = transport(moto_endpoint, q, max_workers=1)  # one request at a time: 10, then 10, then 5
        await t.open()
        batch = msgs(t, [Event(type="t", stream="s", data={"i": i}) for i in range(25)])
        progress = Progress(deadline=asyncio.get_running_loop().time() - 1)  # already passed
        with sending(progress):
            results = await t.send(batch)
        await t.close()
        assert results[:10] == [Delivered()] * 10  # the first message of the key is always started
        assert all(isinstance(r, NotSent) for r in results[10:])
        assert [progress.outcome(m) for m in batch[:10]] == [Delivered()] * 10
        assert len(receive_raw(moto_endpoint, q, 25, wait=2)) == 10

    async def test_stopping_starts_nothing(self, moto_endpoint: str) -> None:
        """Once the relay is stopping no request is started: every message is NotSent, none is sent."""
        q = make_queue(moto_endpoint)
        t = transport(moto_endpoint, q)
        await t.open()
        progress = Progress()
        progress.stop()
        with sending(progress):
            results = await t.send(msgs(t, [Event(type="t", stream=f"s{i}") for i in range(3)]))
        await t.close()
        assert all(isinstance(r, NotSent) and "stopping" in r.error for r in results)
        assert receive_raw(moto_endpoint, q, 1, wait=1) == []

    def test_secrets_hidden_and_registered(self) -> None:
        """The registry builds the transport from options; secrets never show in reprs."""
        t = Registry().create_transport(
            "sqs", {"queue_url": "https://q", "secret_access_key": "s3cr3t", "session_token": "t0k"}, destination="d"
        )
        assert isinstance(t, SQSTransport)
        assert "s3cr3t" not in repr(t.config) and "t0k" not in repr(t.config)
        with pytest.raises(ConfigError):
            Registry().create_transport("sqs", {"queue_url": "q", "bogus": 1}, destination="d")


async def test_concurrent_sends_do_not_block_loop(moto_endpoint: str) -> None:
    """Sends run in the transport's threads: the event loop keeps ticking meanwhile."""
    q = make_queue(moto_endpoint)
    t = transport(moto_endpoint, q)
    await t.open()
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0.005)

    task = asyncio.create_task(ticker())
    batches = [[Event(type="t", stream=f"s{i}", data={"i": i}) for i in range(50)] for _ in range(4)]
    results = await asyncio.gather(*(t.send(msgs(t, b)) for b in batches))
    stop.set()
    await task
    await t.close()
    assert all(r == [Delivered()] * 50 for r in results)
    assert ticks > 3
