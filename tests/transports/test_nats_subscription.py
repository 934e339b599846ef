"""Subscriptions of the nats transport (consumer groups and fan-out) against a real JetStream server."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator

import nats
import pytest

from outrelay import Event, Message, PermanentError, RetryableError
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.transports.nats._config import NatsConfig, derive_target
from outrelay.transports.nats._group import NatsGroup, names
from outrelay.transports.nats._transport import NatsTransport
from tests.peers.nats import StreamFactory
from tests.services import free_port

CLAIM = 1.5  # short leases: a crashed member's shards move within about this


class Bus:
    """A stream, a transport publishing to ``<prefix>.<stream>``, and the backends a test made."""

    def __init__(self, url: str, name: str, prefix: str) -> None:
        self.url, self.name, self.prefix = url, name, prefix
        cfg = NatsConfig(servers=(url,), subject=prefix + ".{stream}", expected_stream=name, group_shards=4)
        self.t = NatsTransport(cfg)
        self.backends: list[SubscriptionBackend] = []
        self.groups: set[str] = set()

    def sub(self, group: str | None = None, member: str = "m", **kw: object) -> SubscriptionBackend:
        spec = SubscriptionSpec(target=f"{self.prefix}.>", group=group, member=member, **kw)  # type: ignore[arg-type]
        b = self.t.subscription(spec)
        self.backends.append(b)
        if group:
            self.groups.add(group)
        return b

    async def publish(self, events: list[Event]) -> None:
        for lo in range(0, len(events), 500):
            msgs = [Message(e, self.t.target(e), e.stream) for e in events[lo : lo + 500]]
            results = await self.t.send(msgs)
            assert all(type(r).__name__ == "Delivered" for r in results), results

    async def cleanup(self) -> None:
        for b in self.backends:
            with contextlib.suppress(Exception):
                await b.stop()
        await self.t.close()
        nc = await nats.connect(self.url)
        try:
            js = nc.jetstream()
            for g in self.groups:
                with contextlib.suppress(Exception):
                    await js.delete_key_value(names(self.name, f"{self.prefix}.>", g, 4)[0])
        finally:
            await nc.close()


@pytest.fixture
async def bus(nats_url: str, nats_streams: StreamFactory) -> AsyncIterator[Bus]:
    name, prefix = await nats_streams("sub")
    b = Bus(nats_url, name, prefix)
    await b.t.open()
    try:
        yield b
    finally:
        await b.cleanup()


def events(n: int, streams: int) -> list[Event]:
    return [Event(type="t", stream=f"s{i % streams}", data={"i": i}) for i in range(n)]


def index(m: Inbound) -> int:
    assert m.received is not None, m.error
    return int(m.received.event.data.decode().split(":")[1].rstrip("}"))


async def drain(b: SubscriptionBackend, want: int, limit: float = 10.0, ack: bool = True) -> list[Inbound]:
    """Receive (and ack) until ``want`` messages arrived or ``limit`` seconds passed."""
    out: list[Inbound] = []
    deadline = time.monotonic() + limit
    while len(out) < want and time.monotonic() < deadline:
        got = await b.receive(want - len(out), 0.3)
        for m in got:
            if ack:
                await m.ack()
        out.extend(got)
    return out


class TestTarget:
    def test_derived_from_the_subject_template(self) -> None:
        """Placeholder tokens become `*`, and `>` when last."""
        assert derive_target("events.{category}.{stream}", destination="d") == "events.*.>"
        assert derive_target("events.{tenant}.orders", destination="d") == "events.*.orders"

    def test_placeholder_inside_a_token_is_refused(self) -> None:
        """A placeholder sharing a token with text has no NATS pattern: PermanentError naming the template."""
        with pytest.raises(PermanentError, match=r"ev-\{type\}.*explicit target"):
            derive_target("x.ev-{type}", destination="d")


class TestGroup:
    async def test_members_share_with_exact_per_stream_order(self, bus: Bus) -> None:
        """Three members share 2,000 events over 50 streams: each handled once, one stream never on two members
        at once, and in publish order, though handlers take random time."""
        group = "g" + uuid.uuid4().hex[:6]
        members = [bus.sub(group, f"w{i}", claim_timeout=CLAIM, prefetch=64) for i in range(3)]
        for m in members:
            await m.start()
        evs = events(2000, 50)
        handled: dict[str, list[tuple[int, float, float, str]]] = defaultdict(list)
        counts: dict[str, int] = defaultdict(int)
        done = asyncio.Event()

        async def handle(name: str, batch: list[Inbound]) -> None:
            for m in batch:
                start = time.monotonic()
                await asyncio.sleep(random.random() * 0.002)
                assert m.received is not None
                handled[m.stream].append((index(m), start, time.monotonic(), name))
                counts[m.received.event.id] += 1
                await m.ack()
            if len(counts) >= len(evs):
                done.set()

        async def run(name: str, b: SubscriptionBackend) -> None:
            while not done.is_set():
                got = await b.receive(64, 0.2)
                lanes: dict[str, list[Inbound]] = defaultdict(list)
                for m in got:
                    lanes[m.stream].append(m)
                await asyncio.gather(*(handle(name, lane) for lane in lanes.values()))

        async with asyncio.timeout(40):
            workers = [asyncio.create_task(run(f"w{i}", b)) for i, b in enumerate(members)]
            await bus.publish(evs)
            await done.wait()
            await asyncio.sleep(0.5)  # any late duplicate would show up here
            for w in workers:
                w.cancel()
        assert len(counts) == len(evs) and set(counts.values()) == {1}
        for stream, rows in handled.items():
            rows.sort(key=lambda r: r[1])
            want = [i for i, e in enumerate(evs) if e.stream == stream]
            assert [r[0] for r in rows] == want, f"stream {stream} handled out of order: {[(r[0], r[3]) for r in rows]}"
            for a, b in itertools.pairwise(rows):
                assert a[2] <= b[1], f"stream {stream}: {a[3]} and {b[3]} handled it at once"
        assert len({r[3] for rows in handled.values() for r in rows}) >= 2, "the members did not share the work"

    async def test_crashed_member_unacked_move_to_a_survivor_in_order(self, bus: Bus) -> None:
        """A member that dies holding unacked events: a survivor gets them within about claim_timeout, nothing is
        lost, and no later event of those streams is handled before them."""
        group = "g" + uuid.uuid4().hex[:6]
        a, b = bus.sub(group, "a", claim_timeout=CLAIM, prefetch=32), bus.sub(group, "b", claim_timeout=CLAIM)
        await a.start()
        await b.start()
        await asyncio.sleep(CLAIM)  # let the two members split the shards
        assert isinstance(a, NatsGroup)
        evs = events(200, 10)
        async with asyncio.timeout(30):
            await bus.publish(evs)
            acked = await drain(a, 5, limit=5)
            held = await drain(a, 10, limit=5, ack=False)
            assert held, "member a got no events"
            # the crash: no ack, no release, no renewal
            assert a._ticker is not None
            a._ticker.cancel()
            assert a._nc is not None
            await a._nc.close()
            crashed = time.monotonic()
            later: list[tuple[Inbound, float]] = []
            while time.monotonic() - crashed < 4 * CLAIM + 5:
                for m in await b.receive(100, 0.3):
                    later.append((m, time.monotonic()))
                    await m.ack()
                ids = {m.received.event.id for m in acked + [m for m, _ in later] if m.received}
                if len(ids) == len(evs):
                    break
        assert {e.id for e in evs} == ids, "events were lost"
        first_seen = {}
        for m, at in later:
            assert m.received is not None
            first_seen.setdefault(m.received.event.id, at)
        for m in held:
            assert m.received is not None
            assert first_seen[m.received.event.id] - crashed < CLAIM + 3, "took too long to move"
        per_stream: dict[str, list[int]] = defaultdict(list)
        for m, _ in later:
            per_stream[m.stream].append(index(m))
        for stream, seq in per_stream.items():
            assert seq == sorted(seq), f"stream {stream} handled out of order after the takeover: {seq}"

    async def test_default_single_shard_keeps_one_active_member(self, bus: Bus) -> None:
        """With the default group_shards = 1, one member handles everything in order; a survivor takes over."""
        cfg = NatsConfig(servers=(bus.url,), subject=bus.prefix + ".{stream}", expected_stream=bus.name)
        t = NatsTransport(cfg)
        group = "g" + uuid.uuid4().hex[:6]
        spec = [SubscriptionSpec(target=f"{bus.prefix}.>", group=group, member=f"w{i}", claim_timeout=CLAIM)
                for i in range(2)]  # fmt: skip
        members = [t.subscription(s) for s in spec]
        try:
            for m in members:
                await m.start()
            sent = events(200, 10)
            await bus.publish(sent)
            async with asyncio.timeout(30):
                got = [await drain(m, 200, limit=3) for m in members]
            active = [i for i, g in enumerate(got) if g]
            assert len(active) == 1, [len(g) for g in got]
            assert [m.received.event.id for m in got[active[0]] if m.received] == [e.id for e in sent]
            await members[active[0]].stop()
            later = events(50, 10)
            await bus.publish(later)
            other = members[1 - active[0]]
            async with asyncio.timeout(30):
                took = await drain(other, 50, limit=CLAIM * 6)
            assert [m.received.event.id for m in took if m.received] == [e.id for e in later]
        finally:
            for m in members:
                await m.stop()
            nc = await nats.connect(bus.url)
            with contextlib.suppress(Exception):
                await nc.jetstream().delete_key_value(names(bus.name, f"{bus.prefix}.>", group, 1)[0])
            await nc.close()

    async def test_position_survives_all_members(self, bus: Bus) -> None:
        """All members stop, events are published, and a new member of the group gets exactly those."""
        group = "g" + uuid.uuid4().hex[:6]
        first = [bus.sub(group, f"w{i}", claim_timeout=CLAIM) for i in range(2)]
        for m in first:
            await m.start()
        async with asyncio.timeout(30):
            await bus.publish(events(20, 4))
            seen: set[str] = set()
            while len(seen) < 20:
                for member in first:
                    seen.update(m.received.event.id for m in await drain(member, 20, limit=0.3) if m.received)
            for m in first:
                await m.stop()
            fresh = events(30, 4)
            await bus.publish(fresh)
            late = bus.sub(group, "w9", claim_timeout=CLAIM)
            await late.start()
            after = await drain(late, 30, limit=10)
            after += await drain(late, 1, limit=1)  # nothing more may come
        assert sorted(m.received.event.id for m in after if m.received) == sorted(e.id for e in fresh)

    async def test_event_right_after_start_is_received(self, bus: Bus) -> None:
        """An event published immediately after start() returns reaches a new group."""
        g = bus.sub("g" + uuid.uuid4().hex[:6], claim_timeout=CLAIM)
        await g.start()
        ev = events(1, 1)
        await bus.publish(ev)
        async with asyncio.timeout(10):
            (m,) = await drain(g, 1, limit=5)
        assert m.received is not None and m.received.event.id == ev[0].id

    async def test_stop_is_idempotent(self, bus: Bus) -> None:
        """stop() twice is fine, and an ack after stop is ignored."""
        g = bus.sub("g" + uuid.uuid4().hex[:6], claim_timeout=CLAIM)
        await g.start()
        await bus.publish(events(1, 1))
        (m,) = await drain(g, 1, limit=5, ack=False)
        await g.stop()
        await g.stop()
        await m.ack()


class TestFanout:
    async def test_every_subscriber_sees_every_event_in_order(self, bus: Bus) -> None:
        """Three fan-out subscribers each see all events published after start, in per-stream order."""
        subs = [bus.sub() for _ in range(3)]
        for s in subs:
            await s.start()
        evs = events(600, 20)
        async with asyncio.timeout(30):
            await bus.publish(evs)
            for s in subs:
                got = await drain(s, len(evs), limit=10)
                assert sorted(index(m) for m in got) == list(range(len(evs)))
                for stream in {e.stream for e in evs}:
                    seen = [index(m) for m in got if m.stream == stream]
                    assert seen == [i for i, e in enumerate(evs) if e.stream == stream]

    async def test_event_right_after_start_is_received(self, bus: Bus) -> None:
        """An event published immediately after start() returns reaches a fan-out subscriber."""
        s = bus.sub()
        await s.start()
        ev = events(1, 1)
        await bus.publish(ev)
        async with asyncio.timeout(10):
            (m,) = await drain(s, 1, limit=5)
        assert m.received is not None and m.received.event.id == ev[0].id

    async def test_stop_is_idempotent(self, bus: Bus) -> None:
        """stop() twice is fine."""
        s = bus.sub()
        await s.start()
        await s.stop()
        await s.stop()


@pytest.mark.parametrize("grouped", [False, True])
async def test_foreign_message_is_reported_not_raised(bus: Bus, grouped: bool) -> None:
    """A message that is not a CloudEvent comes back with received=None and an error; later events still flow."""
    s = bus.sub("g" + uuid.uuid4().hex[:6] if grouped else None, claim_timeout=CLAIM)
    await s.start()
    nc = await nats.connect(bus.url)
    try:
        await nc.jetstream().publish(f"{bus.prefix}.foreign", b"hello")
    finally:
        await nc.close()
    ev = events(1, 1)
    await bus.publish(ev)
    async with asyncio.timeout(10):
        got = await drain(s, 2, limit=5)
    assert got[0].received is None and got[0].error and "not an outrelay CloudEvent" in got[0].error
    assert got[1].received is not None and got[1].received.event.id == ev[0].id


@pytest.mark.parametrize("grouped", [False, True])
async def test_unreachable_broker_at_start_is_retryable(grouped: bool) -> None:
    """start() against a port nobody listens on raises RetryableError with a one-line message."""
    t = NatsTransport(NatsConfig(servers=(f"nats://127.0.0.1:{free_port()}",), connect_timeout=0.5, subject="x.y"))
    s = t.subscription(SubscriptionSpec(target="x.y", group="g" if grouped else None))
    async with asyncio.timeout(15):
        with pytest.raises(RetryableError) as info:
            await s.start()
    assert "\n" not in str(info.value) and "127.0.0.1" in str(info.value)
