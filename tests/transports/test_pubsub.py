"""The ``pubsub`` transport against the official Pub/Sub emulator."""

from __future__ import annotations

import time
import uuid
from collections import defaultdict

import pytest

from outrelay import Capabilities, Event, Message, RetryableError, TransportError, UsageError
from outrelay.core.contract.transport import Delivered, Rejected, RetryLater
from outrelay.transports.pubsub._config import PubSubConfig
from outrelay.transports.pubsub._transport import PubSubTransport
from tests.peers.pubsub_emulator import PROJECT, ThrottlingProxy, create_topic
from tests.services import free_port


def _topic() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


def _transport(host: str, topic: str, **options: object) -> PubSubTransport:
    return PubSubTransport(PubSubConfig(project=PROJECT, topic=topic, emulator_host=host, **options))  # type: ignore[arg-type]


def _msgs(events: list[Event], topic: str) -> list[Message]:
    return [Message(e, topic, e.stream) for e in events]


class TestMapping:
    async def test_cloudevents_attributes_and_ordering_key(self, pubsub_emulator: str) -> None:
        """Data goes out untouched, every CloudEvents attribute as ``ce-*``, content type and ordering key set."""
        topic = _topic()
        create_topic(pubsub_emulator, topic)
        t = _transport(pubsub_emulator, topic)
        event = Event(
            type="order.created",
            stream="order-7",
            data={"a": 1},
            tenant="acme",
            correlation_id="c-1",
            labels={"k": "v"},
            metadata={"m": "1"},
        )
        await t.open()
        try:
            async with t.reader(topic) as reader:
                assert await t.send(_msgs([event], topic)) == [Delivered()]
                (got,) = await reader.read(1, 10)
        finally:
            await t.close()
        assert got.body == event.data
        assert got.key == "order-7"
        assert got.headers["ce-id"] == event.id and got.headers["ce-type"] == "order.created"
        assert got.headers["content-type"] == "application/json"
        assert got.event == event

    async def test_order_per_key_within_large_batches(self, pubsub_emulator: str) -> None:
        """1,000 events over 10 keys sent in two batches come back in exact order per ordering key."""
        topic = _topic()
        create_topic(pubsub_emulator, topic)
        t = _transport(pubsub_emulator, topic)
        events = [Event(type="t", stream=f"k{i % 10}", data={"i": i}) for i in range(1000)]
        await t.open()
        try:
            async with t.reader(topic) as reader:
                for chunk in (events[:500], events[500:]):
                    assert all(isinstance(r, Delivered) for r in await t.send(_msgs(chunk, topic)))
                got = await reader.read(1000, 20)
        finally:
            await t.close()
        seen: dict[str, list[str]] = defaultdict(list)
        for g in got:
            seen[g.key or ""].append(g.event.id)
        assert sum(map(len, seen.values())) == 1000
        for k in seen:
            assert seen[k] == [e.id for e in events if e.stream == k]

    async def test_size_limit_exact_and_above(self, pubsub_emulator: str) -> None:
        """Data of exactly max_message_bytes is delivered; one byte more is Rejected without a publish."""
        topic = _topic()
        create_topic(pubsub_emulator, topic)
        t = _transport(pubsub_emulator, topic, max_message_bytes=4096)
        ok = Event(type="t", stream="s", data=b"x" * 4096, content_type="application/octet-stream")
        big = Event(type="t", stream="s2", data=b"x" * 4097, content_type="application/octet-stream")
        await t.open()
        try:
            results = await t.send(_msgs([ok, big], topic))
        finally:
            await t.close()
        assert isinstance(results[0], Delivered) and isinstance(results[1], Rejected)


class TestCapabilities:
    def test_ordering_declared_only_when_enabled(self) -> None:
        """ordering_by_key and ordered_batches follow ``ordering``; native dedupe is never declared."""
        on = PubSubTransport(PubSubConfig(project=PROJECT)).capabilities
        off = PubSubTransport(PubSubConfig(project=PROJECT, ordering=False)).capabilities
        assert isinstance(on, Capabilities)
        assert on.ordering_by_key and on.ordered_batches and not on.native_dedupe
        assert not off.ordering_by_key and not off.ordered_batches and not off.native_dedupe

    def test_emulator_host_needs_a_port(self) -> None:
        """A malformed emulator_host is a config error."""
        with pytest.raises(ValueError, match="HOST:PORT"):
            PubSubConfig(project=PROJECT, emulator_host="localhost")


class TestFailures:
    async def test_missing_topic_is_retryable_and_key_resumes(self, pubsub_emulator: str) -> None:
        """Publishing to a missing topic gives RetryLater; once the topic exists the same key publishes again."""
        topic = _topic()
        t = _transport(pubsub_emulator, topic)
        events = [Event(type="t", stream="k", data={"i": i}) for i in range(3)]
        await t.open()
        try:
            first = await t.send(_msgs(events, topic))
            assert all(isinstance(r, RetryLater) for r in first)
            assert "not found" in first[0].error  # type: ignore[union-attr]
            create_topic(pubsub_emulator, topic)
            assert await t.send(_msgs(events, topic)) == [Delivered()] * 3
        finally:
            await t.close()

    async def test_failed_message_holds_later_ones_of_its_key(self, pubsub_emulator: str) -> None:
        """When a Publish of a key is throttled, later messages of that key in the batch are not delivered."""
        topic = _topic()
        create_topic(pubsub_emulator, topic)
        proxy = ThrottlingProxy(pubsub_emulator).start()
        try:
            proxy.throttle(every=2, count=1)  # the second Publish RPC fails
            t = _transport(proxy.host, topic, max_messages=1)  # one message per RPC
            reader_t = _transport(pubsub_emulator, topic)
            events = [Event(type="t", stream="k", data={"i": i}) for i in range(4)]
            await t.open()
            try:
                async with reader_t.reader(topic) as reader:
                    results = await t.send(_msgs(events, topic))
                    got = await reader.read(4, 3)
            finally:
                await t.close()
        finally:
            proxy.stop()
        assert isinstance(results[0], Delivered)
        assert all(isinstance(r, RetryLater) for r in results[1:])
        assert "ResourceExhausted" in results[1].error  # type: ignore[union-attr]
        assert [g.event.id for g in got] == [events[0].id]


class TestLifecycle:
    async def test_open_unreachable_is_retryable_and_bounded(self) -> None:
        """open() against a port where nothing listens raises RetryableError within open_timeout."""
        t = _transport(f"127.0.0.1:{free_port()}", "x", open_timeout=1.0)
        started = time.monotonic()
        with pytest.raises(RetryableError, match="did not answer"):
            await t.open()
        assert time.monotonic() - started < 5

    async def test_send_after_close_and_idempotent_close(self, pubsub_emulator: str) -> None:
        """close() twice is fine; send() after close raises UsageError."""
        t = _transport(pubsub_emulator, "x")
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send(_msgs([Event(type="t", stream="s")], "x"))

    async def test_check(self, pubsub_emulator: str) -> None:
        """check() names the topic when it exists and says what to fix when it does not."""
        topic = _topic()
        create_topic(pubsub_emulator, topic)
        assert topic in await _transport(pubsub_emulator, topic).check()
        with pytest.raises(TransportError, match="not found"):
            await _transport(pubsub_emulator, "missing-" + topic).check()

    async def test_check_leaves_an_open_transport_open(self, pubsub_emulator: str) -> None:
        """check() on an open transport probes it and leaves it open: a send right after is delivered."""
        topic = _topic()
        create_topic(pubsub_emulator, topic)
        t = _transport(pubsub_emulator, topic)
        await t.open()
        try:
            assert topic in await t.check()
            assert t.is_open
            assert await t.send(_msgs([Event(type="t", stream="s")], topic)) == [Delivered()]
        finally:
            await t.close()


@pytest.mark.parametrize("kind", ["PermissionDenied", "Unauthenticated"])
def test_refused_credentials_are_permanent(kind: str) -> None:
    """PERMISSION_DENIED / UNAUTHENTICATED stops the destination (Rejected with disable_destination, events
    stay pending) saying what to grant, never retried for ever (the emulator has no IAM, so the mapping
    itself is what can be tested here)."""
    from google.api_core import exceptions as gexc

    from outrelay.transports.pubsub._errors import ERRORS

    r = ERRORS.result(getattr(gexc, kind)("caller lacks pubsub.topics.publish"))
    assert isinstance(r, Rejected) and r.disable_destination and "roles/pubsub.publisher" in r.reason
