"""The subscriber runtime on every bus backend: retries, consumer dead letters, parking, the inbox.

What a backend itself must do (one member per event, per-stream order,
failover, fan-out, start positions, foreign messages as data) is certified by
the shipped conformance suite (``outrelay.conformance``, the ``subscription_*``
checks), which runs for every transport declaring subscriptions. These tests
cover the runtime on top: members run as separate processes on the brokers
(tasks on the in-process bus).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from outrelay import Event, RetryPolicy
from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetters
from outrelay.transports.memory import MemoryTransport
from tests.bus.backends import BACKENDS, BusBackend, make_backend
from tests.bus.harness import Harness, events_for

pytestmark = pytest.mark.slow

FAST = RetryPolicy(initial_delay=0.01, max_delay=0.05, jitter=0.0)


@pytest.fixture(params=BACKENDS)
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    backend = await make_backend(request.param, request)
    h = Harness(backend, tmp_path)
    try:
        yield h
    finally:
        try:
            await h.close()
        finally:
            if backend.cleanup is not None:
                await backend.cleanup()


class TestFailures:
    async def test_raising_handler_dead_letters_and_the_stream_continues(self, harness: Harness) -> None:
        """A handler that keeps raising on one event dead-letters it with the seed's fields; its stream goes on."""
        events = events_for(30, 3)
        bad = events[10]
        handled: list[Event] = []

        async def handler(e: Event) -> None:
            if e.id == bad.id:
                raise ValueError("cannot bill this order")
            handled.append(e)

        async with harness.bus() as bus:
            await bus.subscribe(handler, group="billing", max_attempts=3, retry=FAST)
            await bus.publish(events)
            await _until(lambda: len(handled) == len(events) - 1)
            dlq = bus.dead_letters
            assert dlq is not None
            [dl] = dlq.entries(consumer="billing")
        assert dl.event_id == bad.id and dl.stream == bad.stream and dl.type == bad.type
        assert dl.reason == "ValueError: cannot bill this order" and dl.attempts == 3 and dl.state == "dead"
        assert dl.failed_at >= dl.first_failed_at > 0 and dl.member and b'"id"' in dl.body
        lane = [e.id for e in handled if e.stream == bad.stream]
        assert lane == [e.id for e in events if e.stream == bad.stream and e.id != bad.id]

    async def test_park_holds_the_stream_until_a_replay(self, harness: Harness) -> None:
        """With on_exhausted='park' the stream waits (others flow); replaying the dead letter resumes it in order."""
        events = events_for(30, 3)
        bad = events[10]
        broken = {bad.id}
        handled: list[Event] = []

        async def handler(e: Event) -> None:
            if e.id in broken:
                raise RuntimeError("downstream is down")
            handled.append(e)

        async with harness.bus() as bus:
            sub = await bus.subscribe(handler, group="billing", max_attempts=2, retry=FAST, on_exhausted="park")
            sub.poll_interval = 0.1
            await bus.publish(events)
            others = [e for e in events if e.stream != bad.stream]
            await _until(lambda: {e.id for e in others} <= {h.id for h in handled})
            await asyncio.sleep(0.3)
            held = [e.id for e in handled if e.stream == bad.stream]
            assert held == [e.id for e in events if e.stream == bad.stream][: events.index(bad) // 3]
            dlq = bus.dead_letters
            assert dlq is not None
            [dl] = dlq.entries(consumer="billing")
            assert dl.state == "parked"
            broken.clear()
            assert await asyncio.to_thread(dlq.replay, [dl.id], consumer="billing") == 1
            await _until(lambda: len(handled) == len(events))
            assert dlq.get(dl.id).state == "replayed"
        lane = [e.id for e in handled if e.stream == bad.stream]
        assert lane == [e.id for e in events if e.stream == bad.stream]


class TestForeignMessage:
    async def test_foreign_message_is_dead_lettered_and_events_flow(self, tmp_path: Path) -> None:
        """A message that is not an outrelay CloudEvent is dead-lettered with the reason; later events are handled.
        (That each backend hands such a message over as data is the conformance suite's
        ``subscription_foreign_message``; the runtime's part does not depend on the backend.)"""
        broker = f"bus-{uuid.uuid4().hex[:10]}"
        harness = Harness(BusBackend("memory", {"transport": "memory", "broker": broker}, processes=False), tmp_path)
        events = events_for(5, 1)
        got: list[str] = []
        async with harness.bus() as bus:
            await bus.subscribe(lambda e: got.append(e.id), group="strict")
            MemoryTransport.broker(broker).put_foreign("order.created", b"not a cloudevent")
            await bus.publish(events)
            await _until(lambda: len(got) == len(events))
            dlq = bus.dead_letters
            assert dlq is not None
            await _until(lambda: bool(dlq.entries(consumer="strict")))
            [dl] = dlq.entries(consumer="strict")
        assert got == [e.id for e in events]
        assert dl.reason.startswith("not an outrelay CloudEvent") and dl.type == ""


class TestInbox:
    # the in-process bus, and one broker with member processes that really die: that every broker hands a dead
    # member's unacked events to a survivor is the conformance suite's subscription_member_killed
    @pytest.mark.parametrize("harness", ["memory", "redis"], indirect=True)
    async def test_redelivery_after_a_crash_is_skipped_by_the_inbox(self, harness: Harness) -> None:
        """A member that dies after committing an event's effects but before the ack: the survivor skips it."""
        app_db = harness.tmp / "app.db"
        events = events_for(200, 10)
        crash = events[50]
        await harness.start_members(2, group="billing", app_db=app_db, crash_on=crash.id)
        await harness.publish(events)
        await harness.wait_for({e.id for e in events}, timeout=60 + harness.claim_timeout)
        await _until(lambda: sum(r["id"] == crash.id for r in harness.records()) >= 2, timeout=30)
        import sqlite3

        with sqlite3.connect(app_db) as db:
            effects = Counter(row[0] for row in db.execute("SELECT event_id FROM effects"))
        assert set(effects) == {e.id for e in events} and max(effects.values()) == 1
        again = sorted((r for r in harness.records() if r["id"] == crash.id), key=lambda r: r["start"])
        assert [r["skipped"] for r in again[:2]] == [False, True]


async def _until(cond: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)


def test_dead_letters_table_filters_by_consumer(tmp_path: Path) -> None:
    """Consumer dead letters are listed, queued for replay and purged per consumer."""
    dlq = ConsumerDeadLetters(f"sqlite:///{tmp_path}/d.db")
    common = dict(member="m", type="t", stream="s", tenant=None, body=b"{}", content_type=None, reason="r",
                  attempts=1, first_failed_at=1.0, failed_at=2.0)  # fmt: skip
    a = dlq.record(consumer="a", event_id="e1", **common)  # type: ignore[arg-type]
    dlq.record(consumer="b", event_id="e2", **common)  # type: ignore[arg-type]
    assert [d.event_id for d in dlq.entries(consumer="a")] == ["e1"]
    assert dlq.replay(None, consumer="a") == 1 and dlq.get(a).state == "queued"
    assert [d.id for d in dlq.take_queued("a", "m2")] == [a] and dlq.get(a).state == "replaying"
    assert dlq.purge(None, consumer="b") == 1 and dlq.entries(consumer="b") == []
