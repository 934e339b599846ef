"""The ``pulsar`` transport against pulsar-lite (or ``OUTRELAY_PULSAR_URL``)."""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest

from outrelay import Delivered, Event, Message, Registry, Rejected, RetryableError, RetryLater, UsageError
from outrelay.core.model.errors import TransportError
from outrelay.kit import NotSent, Progress, sending
from outrelay.transports.pulsar._transport import PulsarConfig, PulsarTransport


def topic() -> str:
    return f"persistent://public/default/t-{uuid.uuid4().hex[:10]}"


def transport(url: str, topic: str, **extra: Any) -> PulsarTransport:
    return PulsarTransport(PulsarConfig(service_url=url, topic=topic, **extra))


def msgs(t: PulsarTransport, events: list[Event]) -> list[Message]:
    return [Message(e, t.target(e), e.stream) for e in events]


class TestPulsarTransport:
    async def test_round_trip_binary_mode(self, pulsar_url: str) -> None:
        """Events read back equal, with ce_* properties, content-type and the stream as partition key."""
        name = topic()
        t = transport(pulsar_url, name)
        await t.open()
        events = [Event(type="order.created", stream=f"s{i % 2}", data={"i": i}, tenant="acme") for i in range(4)]
        async with t.reader(name) as reader:
            assert await t.send(msgs(t, events)) == [Delivered()] * 4
            got = await reader.read(4, 5)
        await t.close()
        assert [r.event for r in got] == events
        assert got[0].headers["ce_type"] == "order.created" and got[0].headers["ce_specversion"] == "1.0"
        assert got[0].headers["content-type"] == "application/json"
        assert [r.key for r in got] == [e.stream for e in events]

    async def test_template_topics_get_their_own_producers(self, pulsar_url: str) -> None:
        """A templated topic renders per event and each topic receives its own events."""
        base = f"persistent://public/default/tpl-{uuid.uuid4().hex[:8]}"
        t = transport(pulsar_url, base + "-{category}")
        await t.open()
        a, b = Event(type="alpha.x", stream="s"), Event(type="beta.y", stream="s")
        async with t.reader(base + "-alpha") as ra, t.reader(base + "-beta") as rb:
            assert await t.send(msgs(t, [a, b])) == [Delivered(), Delivered()]
            got_a, got_b = await ra.read(1, 5), await rb.read(1, 5)
        await t.close()
        assert [r.event.id for r in got_a] == [a.id] and [r.event.id for r in got_b] == [b.id]

    async def test_ordered_batch_per_key(self, pulsar_url: str) -> None:
        """Many messages of interleaved keys in one batch arrive in per-key order."""
        name = topic()
        t = transport(pulsar_url, name)
        assert t.capabilities.ordered_batches
        await t.open()
        events = [Event(type="t", stream=f"k{i % 5}", data={"i": i}) for i in range(200)]
        async with t.reader(name) as reader:
            assert await t.send(msgs(t, events)) == [Delivered()] * 200
            got = await reader.read(200, 10)
        await t.close()
        for k in range(5):
            assert [r.event.id for r in got if r.key == f"k{k}"] == [e.id for e in events if e.stream == f"k{k}"]

    async def test_oversized_rejected_and_halts_key(self, pulsar_url: str) -> None:
        """An oversized message is Rejected and later messages of its key in the batch are RetryLater."""
        t = transport(pulsar_url, topic(), max_message_bytes=1024)
        await t.open()
        big = Event(type="t", stream="a", data=b"x" * 1025)
        events = [big, Event(type="t", stream="a"), Event(type="t", stream="b")]
        results = await t.send(msgs(t, events))
        await t.close()
        assert isinstance(results[0], Rejected) and isinstance(results[1], RetryLater) and results[2] == Delivered()

    async def test_dedupe_mode_sequence_ids(self, pulsar_url: str) -> None:
        """With deduplication, a confirmed sequence is not re-sent, and an out-of-order older one still arrives."""
        name = topic()
        t = transport(pulsar_url, name, deduplication=True, producer_name=f"p-{uuid.uuid4().hex[:8]}")
        caps = t.capabilities
        assert caps.native_dedupe and not caps.ordered_batches
        await t.open()
        ev5 = Event(type="t", stream="a", sequence=5)
        ev3 = Event(type="t", stream="b", sequence=3)
        async with t.reader(name) as reader:
            assert await t.send(msgs(t, [ev5])) == [Delivered()]
            assert await t.send(msgs(t, [ev5])) == [Delivered(duplicate=True)]
            assert await t.send(msgs(t, [ev3])) == [Delivered()]  # below the producer's highest: not dropped
            got = await reader.read(3, 3)
        await t.close()
        assert sorted(r.event.id for r in got) == sorted([ev5.id, ev3.id])

    async def test_progress_kept_and_nothing_started_once_stopped(self, pulsar_url: str) -> None:
        """Every confirmed message lands in the send's progress; a stopped progress starts nothing (NotSent)."""
        name = topic()
        t = transport(pulsar_url, name)
        await t.open()
        try:
            async with t.reader(name) as reader:
                batch = msgs(t, [Event(type="t", stream=f"s{i % 2}") for i in range(4)])
                progress = Progress()
                with sending(progress):
                    assert await t.send(batch) == [Delivered()] * 4
                assert [progress.outcome(m) for m in batch] == [Delivered()] * 4
                assert len(await reader.read(4, 5)) == 4
                stopped = Progress()
                stopped.stop()
                with sending(stopped):
                    results = await t.send(msgs(t, [Event(type="t", stream="s0")]))
                assert isinstance(results[0], NotSent) and await reader.read(1, 1) == []
        finally:
            await t.close()

    async def test_lifecycle(self, pulsar_url: str) -> None:
        """close is idempotent, send after close raises UsageError, a down broker fails open quickly."""
        t = transport(pulsar_url, topic())
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send([])
        down = transport("pulsar://127.0.0.1:1", topic(), connect_timeout=1, operation_timeout=2)
        started = time.monotonic()
        with pytest.raises(RetryableError):
            await down.open()
        with pytest.raises(TransportError, match="service_url"):
            await down.check()
        assert time.monotonic() - started < 12

    async def test_templated_topic_with_broker_down_fails_batch_fast(self) -> None:
        """With a templated topic, open() is lazy and a batch to a dead broker is RetryLater within one timeout."""
        dead = "pulsar://127.0.0.1:1"
        t = transport(dead, "persistent://public/default/{type}", connect_timeout=1, operation_timeout=1)
        await t.open()
        started = time.monotonic()
        results = await t.send(msgs(t, [Event(type="a", stream=f"s{i}") for i in range(20)]))
        await t.close()
        assert all(isinstance(r, RetryLater) for r in results)
        assert time.monotonic() - started < 6

    async def test_check(self, pulsar_url: str) -> None:
        """check() is one line naming the topic."""
        name = topic()
        line = await transport(pulsar_url, name).check()
        assert name in line and "\n" not in line

    def test_registered_and_token_hidden(self) -> None:
        """The registry builds the transport; the token never shows in its repr."""
        t = Registry().create_transport("pulsar", {"topic": "t", "token": "s3cr3t-token"}, destination="d")
        assert isinstance(t, PulsarTransport) and "s3cr3t-token" not in repr(t.config)


@pytest.mark.parametrize("result", ["AuthenticationError", "AuthorizationError"])
def test_refused_credentials_are_permanent(result: str) -> None:
    """A broker refusing the credentials (or their right to produce) stops the destination (Rejected with
    disable_destination: events stay pending), never retried for ever (pulsar-lite has no authentication,
    so the mapping itself is what can be tested here)."""
    import pulsar

    from outrelay.transports.pulsar._errors import ERRORS, outcome

    r = outcome(getattr(pulsar.Result, result))
    assert isinstance(r, Rejected) and r.disable_destination and result in r.reason
    with pytest.raises(TransportError) as err, ERRORS.boundary("open", destination="p"):
        raise getattr(pulsar, result)("refused")
    assert not isinstance(err.value, RetryableError) and "refused" in str(err.value)
