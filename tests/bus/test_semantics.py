"""One suite, every bus backend: the same semantics on the in-process bus and each real broker.

Members run as separate processes on the brokers (tasks on the in-process
bus). Sizes follow the issue: ``OUTRELAY_BUS_EVENTS`` events (default
10,000) over 100 streams for the group runs.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from outrelay import Event, RetryPolicy
from outrelay.core.consumer_dlq import ConsumerDeadLetters
from tests.bus.backends import BACKENDS, make_backend
from tests.bus.harness import Harness, events_for, first_handlings

pytestmark = pytest.mark.slow

EVENTS = int(os.environ.get("OUTRELAY_BUS_EVENTS", "10000"))
FAST = RetryPolicy(initial_delay=0.01, max_delay=0.05, jitter=0.0)


@pytest.fixture(params=BACKENDS)
async def harness(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Harness]:
    h = Harness(await make_backend(request.param, request), tmp_path)
    try:
        yield h
    finally:
        await h.close()


def assert_ordered_without_overlap(records: list[dict[str, object]]) -> None:
    """Each stream's events were first handled in index order, never two at once."""
    for stream, lane in first_handlings(records).items():
        indexes = [r["i"] for r in lane]
        assert indexes == sorted(indexes), f"stream {stream} handled out of order: {indexes[:20]}..."
        for a, b in itertools.pairwise(lane):
            assert a["end"] <= b["start"], f"stream {stream}: events {a['i']} and {b['i']} handled at once"


class TestGroup:
    async def test_three_members_share_each_event_once_in_stream_order(self, harness: Harness) -> None:
        """Three members of one group handle every event exactly once, per-stream order exact, work shared."""
        members = await harness.start_members(3, group="workers", delay=0.0005)
        events = events_for(EVENTS, 100)
        await harness.publish(events)
        await harness.wait_for({e.id for e in events})
        await asyncio.sleep(0.5)  # a duplicate would show up now
        records = harness.records()
        counts = Counter(r["id"] for r in records)
        assert len(counts) == len(events)
        assert max(counts.values()) == 1, f"{sum(c > 1 for c in counts.values())} events handled twice"
        assert_ordered_without_overlap(records)
        per_member = Counter(r["member"] for r in records)
        assert len(per_member) >= 2, f"one member did all the work: {per_member} (members: {[m.name for m in members]})"

    async def test_killed_member_events_move_to_a_survivor(self, harness: Harness) -> None:
        """A member SIGKILLed mid-run loses nothing: its unacked events go to survivors within the claim timeout."""
        members = await harness.start_members(3, group="workers", delay=0.002)
        events = events_for(EVENTS, 100)
        publishing = asyncio.create_task(harness.publish(events))
        victim = members[0]
        deadline = time.monotonic() + 60
        while len(harness.records([victim])) < 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        assert harness.records([victim]), "the victim never got any work"
        await victim.kill()
        killed_at = time.monotonic()
        await publishing
        await harness.wait_for({e.id for e in events}, timeout=120 + harness.claim_timeout)
        records = harness.records()
        victim_ids = {r["id"] for r in harness.records([victim])}
        counts = Counter(r["id"] for r in records)
        twice = {i for i, c in counts.items() if c > 1}
        assert twice <= victim_ids, "only the dead member's unacked events may be handled again"
        assert_ordered_without_overlap([r for r in records if r["member"] != victim.name or r["end"] < killed_at])
        # the streams the victim was busy with continue within the claim timeout (+ slack for a loaded machine)
        victim_streams = {r["stream"] for r in harness.records([victim])}
        after = [r["start"] for r in records if r["stream"] in victim_streams and r["start"] > killed_at]
        assert after, "no survivor took over the dead member's streams"
        assert min(after) - killed_at <= harness.claim_timeout + 10


class TestFanOut:
    async def test_every_subscriber_sees_every_event_in_order(self, harness: Harness) -> None:
        """Three fan-out subscribers each handle every event once, in per-stream order."""
        members = await harness.start_members(3, group=None)
        events = events_for(min(EVENTS, 2000), 20)
        await harness.publish(events)
        for m in members:
            await harness.wait_for({e.id for e in events}, [m])
        for m in members:
            records = harness.records([m])
            assert len(records) == len(events), f"{m.name} handled {len(records)} of {len(events)}"
            assert_ordered_without_overlap(records)


class TestSubscribeThenPublish:
    @pytest.mark.parametrize("group", ["fresh-group", None])
    async def test_event_published_right_after_subscribe_is_received(self, harness: Harness, group: str | None) -> None:
        """An event published the moment subscribe() returns is handled (group and fan-out)."""
        got: list[str] = []
        async with harness.bus() as bus:
            await bus.subscribe(lambda e: got.append(e.id), group=group, name="quick")
            event = Event(type="order.created", stream="s1", data={"i": 0})
            await bus.publish(event)
            for _ in range(200):
                if got:
                    break
                await asyncio.sleep(0.05)
        assert got == [event.id]


class TestFidelity:
    async def test_handler_gets_the_event_as_appended(self, harness: Harness) -> None:
        """Every envelope field, the data bytes and the content type reach the handler unchanged."""
        sent = Event(
            type="order.created", stream="order-7", tenant="acme", source="/shop", subject="line/1",
            correlation_id="corr-1", causation_id="cause-1", event_version="2", schema_version="3",
            producer_version="1.4.0", labels={"region": "eu"}, tags=("vip",), metadata={"trace": "t-1"},
            data=b"\x00\x01binary\xff", content_type="application/octet-stream",
        )  # fmt: skip
        got: list[Event] = []
        async with harness.bus() as bus:
            await bus.subscribe(got.append, group="fidelity")
            await harness.publish([sent])
            await _until(lambda: bool(got))
        [e] = got
        fields = ("id", "type", "stream", "tenant", "source", "subject", "correlation_id", "causation_id",
                  "event_version", "schema_version", "producer_version", "labels", "tags", "metadata", "data",
                  "content_type", "time_text")  # fmt: skip
        assert {f: getattr(e, f) for f in fields} == {f: getattr(sent, f) for f in fields}
        assert e.sequence is not None  # the outbox sequence travels as the CloudEvents extension


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

    async def test_foreign_message_is_dead_lettered_and_events_flow(self, harness: Harness) -> None:
        """A message that is not an outrelay CloudEvent is dead-lettered with the reason; later events are handled."""
        events = events_for(5, 1)
        got: list[str] = []
        async with harness.bus() as bus:
            await bus.subscribe(lambda e: got.append(e.id), group="strict")
            await harness.backend.foreign()
            await bus.publish(events)
            await _until(lambda: len(got) == len(events))
            dlq = bus.dead_letters
            assert dlq is not None
            await _until(lambda: bool(dlq.entries(consumer="strict")))
            [dl] = dlq.entries(consumer="strict")
        assert got == [e.id for e in events]
        assert dl.reason.startswith("not an outrelay CloudEvent") and dl.type == ""


class TestInbox:
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
