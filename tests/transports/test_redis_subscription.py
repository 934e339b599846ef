"""The redis subscription backend (consumer groups with a per-stream gate, fan-out) against a real Redis."""

from __future__ import annotations

import asyncio
import collections
import gc
import itertools
import random
import time
import uuid
import warnings
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from outrelay import Event, Message, PermanentError, RetryableError
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.transports.redis._group import RedisGroup
from outrelay.transports.redis._transport import RedisConfig, RedisTransport
from tests.peers.proxy import TcpProxy
from tests.services import free_port


def key() -> str:
    return f"outrelay-test:sub:{uuid.uuid4().hex[:10]}"


def make(url: str, stream: str, **extra: object) -> RedisTransport:
    return RedisTransport(RedisConfig.model_validate({"url": url, "stream": stream, **extra}), destination="r")


def events(n: int, streams: int, tag: str = "") -> list[Event]:
    return [Event(type="t", stream=f"s{i % streams}", data={"i": i, "tag": tag}) for i in range(n)]


async def publish(t: RedisTransport, evs: list[Event]) -> None:
    for lo in range(0, len(evs), 500):
        await t.send([Message(e, t.target(e), e.stream) for e in evs[lo : lo + 500]])


async def drain(b: SubscriptionBackend, n: int, within: float = 10.0) -> list[Inbound]:
    """Receive (and ack) until ``n`` messages came or ``within`` seconds passed."""
    got: list[Inbound] = []
    deadline = time.monotonic() + within
    while len(got) < n and time.monotonic() < deadline:
        for m in await b.receive(n - len(got), 0.2):
            got.append(m)
            await m.ack()
    return got


def ids(ms: list[Inbound]) -> list[str]:
    return [m.received.event.id for m in ms if m.received is not None]


async def abandon(b: SubscriptionBackend) -> None:
    """Simulate a crash of a group member: its heartbeat stops and its connection closes, nothing is acked."""
    assert isinstance(b, RedisGroup) and b._client is not None and b._heartbeat is not None
    b._heartbeat.cancel()
    await b._client.aclose()
    b._client = None  # the object is dead: receive/stop do nothing


@pytest.fixture
async def transport(redis_url: str) -> AsyncIterator[RedisTransport]:
    t = make(redis_url, key())
    await t.open()
    yield t
    await t.close()


@pytest.fixture(autouse=True)
async def _delete_test_keys(redis_url: str) -> AsyncIterator[None]:
    """Leave the shared Redis as it was: drop every key these tests created."""
    yield
    client = aioredis.Redis.from_url(redis_url)
    keys = [k async for k in client.scan_iter(match="outrelay-test:sub:*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


def sub(t: RedisTransport, group: str | None = "g", member: str = "m", **kw: object) -> SubscriptionBackend:
    return t.subscription(SubscriptionSpec(target=t.cfg.stream, group=group, member=member, **kw))  # type: ignore[arg-type]


async def gate_keys(t: RedisTransport) -> list[bytes]:
    client = aioredis.Redis.from_url(t.cfg.url)
    try:
        return [k async for k in client.scan_iter(match=f"{t.cfg.stream}:gate:*", count=1000)]
    finally:
        await client.aclose()


class TestGroup:
    async def test_three_members_share_events_exactly_once_in_stream_order(self, transport: RedisTransport) -> None:
        """3 members share 2,000 events of 50 streams: each handled once, a stream's never overlapping nor reordered."""
        evs = events(2000, 50)
        order = {e.id: n for n, e in enumerate(evs)}
        handled: dict[str, list[tuple[float, float, int, str]]] = collections.defaultdict(list)
        members = [sub(transport, member=f"m{i}", claim_timeout=5.0) for i in range(3)]
        for m in members:
            await m.start()
        rng = random.Random(7)
        done = asyncio.Event()

        async def handle(name: str, lane: list[Inbound]) -> None:
            for m in lane:  # the runtime: one stream's messages one at a time, in the order received
                assert m.received is not None
                start = time.monotonic()
                await asyncio.sleep(rng.uniform(0, 0.003))
                handled[m.stream].append((start, time.monotonic(), order[m.received.event.id], name))
                await m.ack()

        async def member(name: str, b: SubscriptionBackend) -> None:
            while not done.is_set():
                lanes: dict[str, list[Inbound]] = collections.defaultdict(list)
                for m in await b.receive(50, 0.1):
                    lanes[m.stream].append(m)
                await asyncio.gather(*(handle(name, lane) for lane in lanes.values()))
                if sum(map(len, handled.values())) >= len(evs):
                    done.set()

        tasks = [asyncio.create_task(member(f"m{i}", b)) for i, b in enumerate(members)]
        await publish(transport, evs)
        await asyncio.wait_for(done.wait(), 40)
        await asyncio.gather(*tasks)
        for m in members:
            await m.stop()
        seen = [n for recs in handled.values() for _, _, n, _ in recs]
        assert sorted(seen) == list(range(len(evs)))  # each event handled exactly once
        for recs in handled.values():
            recs.sort()
            assert [n for _, _, n, _ in recs] == sorted(n for _, _, n, _ in recs)
            assert all(a[1] <= b[0] for a, b in itertools.pairwise(recs))  # never two at once
        assert len({name for recs in handled.values() for *_, name in recs}) == 3  # all members took part
        assert await gate_keys(transport) == []  # the gate lists emptied out

    async def test_a_crashed_member_s_events_move_to_a_survivor_first(self, transport: RedisTransport) -> None:
        """A member abandoned without ack: a survivor (its prefetch full of blocked events) gets them within
        ~claim_timeout, before the later events of their streams."""
        first, later = events(40, 4, "first"), events(40, 4, "later")
        a = sub(transport, member="a", claim_timeout=1.0)
        b = sub(transport, member="b", claim_timeout=1.0, prefetch=8)
        await a.start()
        await b.start()
        await publish(transport, first)
        taken = await a.receive(20, 2)  # a holds 20 unacked (perhaps more waiting at the gate)
        assert taken
        await abandon(a)
        crashed = time.monotonic()
        await publish(transport, later)
        got = await drain(b, 80, within=10)
        elapsed = time.monotonic() - crashed
        await b.stop()
        assert sorted(ids(got)) == sorted(e.id for e in first + later)  # nothing lost, nothing twice
        position = {e.id: n for n, e in enumerate(first + later)}
        for s in {e.stream for e in first}:
            handled = [position[m.received.event.id] for m in got if m.received and m.stream == s]
            assert handled == sorted(handled)  # the crashed member's events came before later ones of the stream
        assert elapsed < 1.0 + 3.0
        assert any(m.delivery_count > 1 for m in got if m.broker_id in {t.broker_id for t in taken})

    async def test_a_stopped_member_hands_over_at_once(self, transport: RedisTransport) -> None:
        """stop() with unacked events makes them claimable at once: a survivor has them well before claim_timeout."""
        a = sub(transport, member="a", claim_timeout=20.0)
        b = sub(transport, member="b", claim_timeout=20.0)
        await a.start()
        await b.start()
        evs = events(30, 3)
        await publish(transport, evs)
        taken = await a.receive(30, 2)
        assert taken
        await a.stop()
        started = time.monotonic()
        got = await drain(b, 30, within=8)
        await b.stop()
        assert sorted(ids(got)) == sorted(e.id for e in evs)
        assert time.monotonic() - started < 5.0

    async def test_the_group_position_survives_its_members(self, transport: RedisTransport) -> None:
        """All members stop, events are published, a new member of the group gets exactly those."""
        await publish(transport, events(5, 1, "before the group"))
        for name in ("m1", "m2"):
            b = sub(transport, member=name)
            await b.start()
            assert await b.receive(10, 0.2) == []
            await b.stop()
        evs = events(30, 5)
        await publish(transport, evs)
        c = sub(transport, member="m3")
        await c.start()
        got = await drain(c, 30)
        assert await c.receive(10, 0.3) == []
        await c.stop()
        assert sorted(ids(got)) == sorted(e.id for e in evs)
        for s in {e.stream for e in evs}:
            assert [m.received.event.id for m in got if m.received and m.stream == s] == [
                e.id for e in evs if e.stream == s
            ]

    async def test_prefetch_bounds_unacked_messages(self, transport: RedisTransport) -> None:
        """A member holds at most prefetch unacked messages: without acks it receives no more."""
        b = sub(transport, prefetch=7)
        await b.start()
        await publish(transport, events(20, 2))
        first = await b.receive(100, 1)
        more = await b.receive(100, 0.3)
        await b.stop()
        assert len(first) + len(more) == 7

    async def test_an_ack_racing_the_heartbeat_is_not_reported_as_a_takeover(
        self, transport: RedisTransport, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A released entry acked just before the heartbeat re-claims it (here: acked behind the member's back)
        is not reported as taken by another member, and the member's other entries stay its own."""
        b = sub(transport, claim_timeout=0.3)  # heartbeat every 0.1 s
        await b.start()
        await publish(transport, events(2, 2))
        got = await b.receive(2, 2)
        assert len(got) == 2
        client = aioredis.Redis.from_url(transport.cfg.url)
        await client.xack(transport.cfg.stream, "g", got[0].broker_id)
        with caplog.at_level("WARNING", logger="outrelay.transports.redis"):
            await asyncio.sleep(0.35)
        pending = await client.xpending_range(transport.cfg.stream, "g", min="-", max="+", count=10)
        await client.aclose()
        for m in got:
            await m.ack()
        await b.stop()
        assert [p["consumer"] for p in pending] == [b"m"]  # the unacked one is still this member's
        assert not [r for r in caplog.records if "claimed by another member" in r.getMessage()]

    @pytest.mark.parametrize("mode", ["binary", "structured"])
    async def test_a_member_gets_every_entry_byte_for_byte(self, redis_url: str, mode: str) -> None:
        """Binary data (every byte value), non-ASCII ordering keys and foreign entries (empty, non-UTF-8 and
        comma-laden fields) come out of a group exactly as out of a plain XREAD: same event, headers, body, key."""
        k = key()
        t = make(redis_url, k, mode=mode)
        await t.open()
        blob = bytes(range(256)) * 3 + b",\r\n$*"
        evs = [
            Event(type="t", stream="zürich, 1 ✓", data=blob, content_type="application/octet-stream"),
            Event(type="t", stream="s", data={"i": "ünïcode"}, labels={"a": "b"}, metadata={"traceparent": "x"}),
            Event(type="t", stream="t", data=b""),
        ]
        foreign: list[dict[str | bytes, str | bytes]] = [
            {"hello": ""},
            {b"ce_streamid": "s", b"\xff,name": b"\xfe\x00,", "data": ""},
            {"ce_partitionkey": "p", "data": blob, "content-type": "application/cloudevents+json"},
        ]
        member = sub(t, member="m")
        fanout = sub(t, group=None)
        try:
            await member.start()
            await fanout.start()
            await publish(t, evs[:2])
            client = aioredis.Redis.from_url(redis_url)
            for fields in foreign:
                await client.xadd(k, fields)  # type: ignore[arg-type]
            await client.aclose()
            await publish(t, evs[2:])
            got = await drain(member, 6, within=5)
            seen = await drain(fanout, 6, within=5)
        finally:
            await member.stop()
            await fanout.stop()
            await t.close()
        assert [m.broker_id for m in got] == [m.broker_id for m in seen] and len(got) == 6
        for a, b in zip(got, seen, strict=True):
            assert (a.stream, a.error, a.delivery_count) == (b.stream, b.error, 1)
            if b.received is None:
                assert a.received is None
                continue
            assert a.received is not None
            assert (a.received.event, a.received.headers, a.received.body) == (
                b.received.event,
                b.received.headers,
                b.received.body,
            )
        assert [m.received.event for m in got if m.received] == evs
        assert [m.stream for m in got] == ["zürich, 1 ✓", "s", "", "s", "p", "t"]
        assert await gate_keys(t) == []


class TestFanout:
    async def test_every_subscriber_sees_every_event_in_order(self, transport: RedisTransport) -> None:
        """3 fan-out subscribers each see all 300 events, in publish (hence per-stream) order."""
        subs = [sub(transport, group=None, member=f"f{i}") for i in range(3)]
        for s in subs:
            await s.start()
        evs = events(300, 10)
        await publish(transport, evs)
        for s in subs:
            got = await drain(s, 300)
            assert ids(got) == [e.id for e in evs]
            await s.stop()


class TestBoth:
    @pytest.mark.parametrize("group", ["g", None])
    async def test_event_published_right_after_start_is_received(
        self, transport: RedisTransport, group: str | None
    ) -> None:
        """An event published immediately after start() returned is received (group and fan-out)."""
        b = sub(transport, group=group)
        await b.start()
        ev = Event(type="t", stream="s", data=b"x")
        await publish(transport, [ev])
        got = await drain(b, 1, within=3)
        await b.stop()
        assert ids(got) == [ev.id]

    @pytest.mark.parametrize("group", ["g", None])
    async def test_foreign_entry_comes_back_as_an_error(self, transport: RedisTransport, group: str | None) -> None:
        """A non-CloudEvent entry is an Inbound with received=None and error; the events after it still flow."""
        b = sub(transport, group=group)
        await b.start()
        client = aioredis.Redis.from_url(transport.cfg.url)
        await client.xadd(transport.cfg.stream, {"hello": "world"})
        await client.xadd(transport.cfg.stream, {"ce_partitionkey": "s0", "data": "{"})
        await client.aclose()
        evs = events(5, 2)
        await publish(transport, evs)
        got = await drain(b, 7, within=5)
        await b.stop()
        foreign = [m for m in got if m.received is None]
        assert len(foreign) == 2 and all(m.error and "not an outrelay CloudEvent" in m.error for m in foreign)
        assert foreign[1].stream == "s0"
        assert ids(got) == [e.id for e in evs]
        if group:
            assert await gate_keys(transport) == []

    @pytest.mark.parametrize("group", ["g", None])
    async def test_stop_is_idempotent_and_ack_after_stop_is_ignored(
        self, transport: RedisTransport, group: str | None
    ) -> None:
        """stop() twice is fine; an ack after stop does nothing; receive after stop returns nothing."""
        b = sub(transport, group=group)
        await b.start()
        await publish(transport, events(2, 1))
        got = await b.receive(2, 2)
        await b.stop()
        await b.stop()
        for m in got:
            await m.ack()
        assert await b.receive(1, 0.1) == []

    @pytest.mark.parametrize(("group", "prefetch"), [("g", 100), ("g", 1), (None, 100)])
    async def test_a_receive_in_flight_at_stop_returns_nothing_and_leaves_no_connection(
        self, transport: RedisTransport, group: str | None, prefetch: int
    ) -> None:
        """stop() while a receive blocks (XREAD BLOCK, or a full member's pause): the receive returns nothing
        instead of the closed connection's error, and opens no connection that outlives the member."""
        b = sub(transport, group=group, prefetch=prefetch)
        await b.start()
        if prefetch == 1:  # one held, unacked: the next receive pauses (nothing may be read) and then claims
            await publish(transport, events(2, 1))
            assert len(await b.receive(1, 2)) == 1
        pending = asyncio.create_task(b.receive(5, 1.0))
        await asyncio.sleep(0.2)
        await b.stop()
        assert await pending == []
        del b, pending
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            gc.collect()
        assert [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)] == []

    @pytest.mark.parametrize("group", ["g", None])
    async def test_unreachable_broker_at_start_is_retryable(self, group: str | None) -> None:
        """start() against a port where nothing listens raises RetryableError in one line naming the server."""
        url = f"redis://127.0.0.1:{free_port()}/0"
        b = make(url, key(), connect_timeout=1.0).subscription(SubscriptionSpec(target="", group=group))
        with pytest.raises(RetryableError) as info:
            await b.start()
        assert "\n" not in str(info.value) and url in str(info.value)

    @pytest.mark.parametrize("group", ["g", None])
    async def test_connection_loss_is_retryable_and_the_next_receive_reconnects(
        self, redis_url: str, group: str | None
    ) -> None:
        """A cut connection makes receive raise RetryableError; the next receive reconnects and gets the events."""
        parts = urlsplit(redis_url)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379)
        await proxy.start()
        k = key()
        t = make(redis_url, k)
        await t.open()
        b = make(f"redis://127.0.0.1:{proxy.port}{parts.path or '/0'}", k).subscription(
            SubscriptionSpec(target="", group=group, claim_timeout=2.0)
        )
        try:
            await b.start()
            pending = asyncio.create_task(b.receive(1, 3))
            await asyncio.sleep(0.3)
            proxy.cut()
            with pytest.raises(RetryableError):
                await pending
            evs = events(3, 1)
            await publish(t, evs)
            got = await drain(b, 3, within=5)
            assert ids(got) == [e.id for e in evs]
        finally:
            await b.stop()
            await t.close()
            await proxy.stop()

    def test_templated_stream_without_target_is_permanent(self, redis_url: str) -> None:
        """A templated `stream` cannot be consumed as a pattern: PermanentError naming the option and the fix."""
        t = make(redis_url, "events:{category}")
        with pytest.raises(PermanentError, match=r"destinations\.r\.stream .* explicit target"):
            t.subscription(SubscriptionSpec(target="", group="g"))
