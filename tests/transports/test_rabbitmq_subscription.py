"""The rabbitmq subscription backend (consumer groups and fan-out) against a real RabbitMQ broker."""

from __future__ import annotations

import asyncio
import itertools
import random
import uuid
from collections import defaultdict
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import aio_pika
import pytest

from outrelay import Delivered, Event, Message, PermanentError, RetryableError, UsageError
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.transports.rabbitmq._config import RabbitMQConfig, binding_pattern
from outrelay.transports.rabbitmq._subscriber import group_queue
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
from tests.peers.proxy import TcpProxy
from tests.peers.rabbitmq import ExchangeFactory
from tests.services import free_port


@dataclass
class Bus:
    """A publishing transport on a fresh exchange, and a factory of subscriptions to it."""

    url: str
    exchange: str
    transport: RabbitMQTransport
    factory: ExchangeFactory

    def subscribe(
        self,
        group: str | None = None,
        url: str | None = None,
        shards: int = 16,
        queue_type: Literal["classic", "quorum"] = "classic",
        **options: object,
    ) -> SubscriptionBackend:
        cfg = RabbitMQConfig(
            url=url or self.url,
            exchange=self.exchange,
            routing_key="ev.{stream}",
            group_shards=shards,
            queue_type=queue_type,
        )
        base = group_queue(group, self.exchange) if group is not None else None
        if base is not None and base not in self.factory.exchanges:  # all deleted at teardown
            self.factory.queues += [base, f"{base}.members", *(f"{base}.{i}" for i in range(16))]
            self.factory.exchanges.insert(0, base)
        spec = SubscriptionSpec("", group=group, **options)  # type: ignore[arg-type]
        return RabbitMQTransport(cfg).subscription(spec)

    async def publish(self, events: list[Event]) -> None:
        for i in range(0, len(events), 500):
            chunk = [Message(e, self.transport.target(e), e.stream) for e in events[i : i + 500]]
            assert all(isinstance(r, Delivered) for r in await self.transport.send(chunk))


@pytest.fixture
async def bus(rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory) -> AsyncIterator[Bus]:
    exchange = await rabbitmq_exchanges("sub")
    t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=exchange, routing_key="ev.{stream}"))
    await t.open()
    yield Bus(rabbitmq_url, exchange, t, rabbitmq_exchanges)
    await t.close()


def make_events(count: int, streams: int) -> list[Event]:
    return [Event(type="sub.test", stream=f"s{i % streams}", data={"i": i}) for i in range(count)]


def new_group() -> str:
    return f"t-{uuid.uuid4().hex[:10]}"


async def drain(backend: SubscriptionBackend, count: int, timeout: float = 10.0, ack: bool = True) -> list[Inbound]:
    """Receive until ``count`` messages came or ``timeout`` passed (acking them unless told not to)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: list[Inbound] = []
    while len(out) < count and loop.time() < deadline:
        for m in await backend.receive(count - len(out), min(0.5, max(0.01, deadline - loop.time()))):
            out.append(m)
            if ack:
                await m.ack()
    return out


def ids(messages: Iterable[Inbound]) -> list[str]:
    return [m.received.event.id for m in messages if m.received is not None]


def per_stream(events: Iterable[Event]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    for e in events:
        out[e.stream].append(e.id)
    return dict(out)


async def consumers_per_shard(bus: Bus, group: str, shards: int) -> list[int]:
    base = group_queue(group, bus.exchange)
    conn = await aio_pika.connect(bus.url)
    async with conn:
        channel = await conn.channel()
        counts = []
        for i in range(shards):
            q = await channel.declare_queue(f"{base}.{i}", passive=True)
            counts.append(q.declaration_result.consumer_count)
        return counts


class Member:
    """A group member handling like the runtime: per-stream lanes, one message of a stream at a time,
    a random small delay per handler, ack after the handler; records each handling's start and end."""

    def __init__(self, name: str, backend: SubscriptionBackend, log: dict[str, list[tuple[float, float, str, str]]]):
        self.name, self.backend, self.log = name, backend, log
        self.lanes: dict[str, asyncio.Queue[Inbound]] = {}
        self.tasks: list[asyncio.Task[None]] = []
        self.rng = random.Random(name)

    async def run(self, done: asyncio.Event) -> None:
        try:
            while not done.is_set():
                for m in await self.backend.receive(100, 0.05):
                    lane = self.lanes.get(m.stream)
                    if lane is None:
                        lane = self.lanes[m.stream] = asyncio.Queue()
                        self.tasks.append(asyncio.create_task(self._lane(lane)))
                    lane.put_nowait(m)
        finally:
            for t in self.tasks:
                t.cancel()
            await asyncio.gather(*self.tasks, return_exceptions=True)

    async def _lane(self, lane: asyncio.Queue[Inbound]) -> None:
        loop = asyncio.get_running_loop()
        while True:
            m = await lane.get()
            assert m.received is not None
            start = loop.time()
            await asyncio.sleep(self.rng.random() * 0.002)
            self.log[m.stream].append((start, loop.time(), m.received.event.id, self.name))
            await m.ack()


SHARDS = pytest.mark.parametrize("shards", [16, 1], ids=["sharded", "single-active"])


class TestGroup:
    @SHARDS
    async def test_members_share_events_once_in_stream_order(self, bus: Bus, shards: int) -> None:
        """3 members handle 2,000 events of 50 streams: each exactly once, each stream in order, never
        overlapping; with shards the work is spread over the members."""
        group = new_group()
        members = [bus.subscribe(group, shards=shards, member=f"m{i}", prefetch=100, claim_timeout=3) for i in range(3)]
        for b in members:
            await b.start()
        events = make_events(2000, 50)
        log: dict[str, list[tuple[float, float, str, str]]] = defaultdict(list)
        done = asyncio.Event()
        runners = [asyncio.create_task(Member(f"m{i}", b, log).run(done)) for i, b in enumerate(members)]
        try:
            if shards > 1:
                await asyncio.sleep(1.5)  # let the members balance the shards
                assert await consumers_per_shard(bus, group, shards) == [1] * shards  # each held by one member
            await bus.publish(events)
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 30
            while sum(map(len, log.values())) < len(events) and loop.time() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.2)  # a duplicate would show up now
        finally:
            done.set()
            await asyncio.gather(*runners)
            for b in members:
                await b.stop()
        handled = [rec[2] for recs in log.values() for rec in recs]
        assert len(handled) == len(events) and set(handled) == {e.id for e in events}
        for stream, want in per_stream(events).items():
            recs = sorted(log[stream])
            assert [r[2] for r in recs] == want, f"stream {stream} handled out of order"
            for before, after in itertools.pairwise(recs):
                assert before[1] <= after[0], f"stream {stream}: {after[2]} started before {before[2]} ended"
        workers = {rec[3] for recs in log.values() for rec in recs}
        assert len(workers) == (3 if shards > 1 else 1), workers

    @SHARDS
    @pytest.mark.parametrize("how", ["stop", "crash"])
    @pytest.mark.parametrize("queue_type", ["classic", "quorum"])
    async def test_unacked_events_move_to_a_survivor_first(
        self, bus: Bus, how: str, shards: int, queue_type: Literal["classic", "quorum"]
    ) -> None:
        """A member that stops or crashes with unacked events: a survivor gets them within claim_timeout,
        before any later event of their streams, and nothing is lost (classic and quorum group queues)."""
        group = new_group()
        parts = urlsplit(bus.url)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
        await proxy.start()
        via_proxy = bus.url.replace(f"{parts.hostname}:{parts.port or 5672}", f"127.0.0.1:{proxy.port}")
        first = bus.subscribe(group, url=via_proxy, shards=shards, queue_type=queue_type, member="first",
                              prefetch=40, claim_timeout=3)  # fmt: skip
        survivor = bus.subscribe(group, shards=shards, queue_type=queue_type, member="survivor", prefetch=500,
                                 claim_timeout=3)  # fmt: skip
        try:
            await first.start()
            events = make_events(200, 10)
            await bus.publish(events[:100])
            taken = await drain(first, 40, timeout=2, ack=False)
            assert 10 <= len(taken) <= 40  # prefetch bounds what a member holds
            for m in taken[:5]:
                await m.ack()
            acked = set(ids(taken[:5]))
            await survivor.start()
            await bus.publish(events[100:])
            loop = asyncio.get_running_loop()
            gone = loop.time()
            if how == "stop":
                await first.stop()
            else:
                proxy.cut()  # what SIGKILL does: the socket closes without an AMQP goodbye
            got = await drain(survivor, 195, timeout=8)
            took = loop.time() - gone
            for stream, want in per_stream(e for e in events if e.id not in acked).items():
                assert [m.received.event.id for m in got if m.received and m.stream == stream] == want, stream
            assert len(got) == 195 and took < 3 + 2  # claim_timeout, plus slack for a loaded machine
            unacked = set(ids(taken[5:]))
            # redelivered: what `first` was handed and did not ack, plus what reached its buffer unhanded
            assert unacked <= {m.received.event.id for m in got if m.received and m.delivery_count == 2}
            if how == "crash":
                with pytest.raises(RetryableError, match="lost"):
                    await first.receive(10, 1)
                assert await first.receive(10, 0.2) == []  # reconnected, a member again
        finally:
            await first.stop()
            await survivor.stop()
            await proxy.stop()

    @SHARDS
    async def test_position_survives_all_members(self, bus: Bus, shards: int) -> None:
        """Events published while every member is stopped go, exactly, to the group's next member."""
        group = new_group()
        olds = [bus.subscribe(group, shards=shards, member=f"old{i}") for i in range(2)]
        for b in olds:
            await b.start()
        await bus.publish(make_events(10, 2))
        got_old = await drain(olds[0], 10, timeout=2) + await drain(olds[1], 10, timeout=1)
        assert len(got_old) == 10
        for b in olds:
            await b.stop()
        events = make_events(50, 5)
        await bus.publish(events)
        new = bus.subscribe(group, shards=shards, member="new")
        await new.start()
        try:
            got = await drain(new, 50)
            for stream, want in per_stream(events).items():
                assert [m.received.event.id for m in got if m.received and m.stream == stream] == want
            assert len(got) == 50 and await new.receive(10, 0.3) == []
        finally:
            await new.stop()

    @SHARDS
    async def test_deleted_queue_is_retryable_then_recreated(self, bus: Bus, shards: int) -> None:
        """When a group queue is deleted under a member, receive raises RetryableError, then reconnects."""
        group = new_group()
        b = bus.subscribe(group, shards=shards)
        await b.start()
        try:
            conn = await aio_pika.connect(bus.url)
            async with conn:
                channel = await conn.channel()
                base = group_queue(group, bus.exchange)
                await channel.queue_delete(f"{base}.0" if shards > 1 else base)
            with pytest.raises(RetryableError, match="cancelled the consumer"):
                await b.receive(10, 2)
            assert await b.receive(10, 0.2) == []  # reconnected: the queue is declared and bound again
            events = make_events(3, 1)
            await bus.publish(events)
            assert ids(await drain(b, 3)) == [e.id for e in events]
        finally:
            await b.stop()

    @SHARDS
    async def test_queue_with_other_arguments_is_a_clear_permanent_error(self, bus: Bus, shards: int) -> None:
        """A group queue that exists with other arguments fails start with a one-line PermanentError and the fix."""
        group = new_group()
        base = group_queue(group, bus.exchange)
        conn = await aio_pika.connect(bus.url)
        async with conn:
            channel = await conn.channel()
            await channel.declare_queue(f"{base}.0" if shards > 1 else base, durable=True,
                                        arguments={"x-max-length": 10})  # fmt: skip
        b = bus.subscribe(group, shards=shards)
        with pytest.raises(PermanentError) as info:
            await b.start()
        text = str(info.value)
        assert base in text and "delete_queue" in text and "\n" not in text
        await b.stop()


class TestFanOut:
    async def test_every_subscriber_sees_every_event_in_order(self, bus: Bus) -> None:
        """3 fan-out subscribers each receive all events, in stream order."""
        subs = [bus.subscribe(member=f"f{i}") for i in range(3)]
        for s in subs:
            await s.start()
        events = make_events(300, 10)
        await bus.publish(events)
        try:
            for s in subs:
                got = await drain(s, 300)
                assert len(got) == 300
                for stream, want in per_stream(events).items():
                    assert [m.received.event.id for m in got if m.received and m.stream == stream] == want
        finally:
            for s in subs:
                await s.stop()


class TestBoth:
    @pytest.mark.parametrize("group", [True, False])
    async def test_event_right_after_start_is_received(self, bus: Bus, group: bool) -> None:
        """An event published as soon as start() returned is received (group and fan-out)."""
        b = bus.subscribe(new_group() if group else None)
        await b.start()
        try:
            (event,) = make_events(1, 1)
            await bus.publish([event])
            assert ids(await drain(b, 1, timeout=5)) == [event.id]
        finally:
            await b.stop()

    async def test_foreign_message_is_reported_and_events_still_flow(self, bus: Bus) -> None:
        """A message that is not a CloudEvent comes back with received=None and an error; later events flow."""
        b = bus.subscribe(new_group())
        await b.start()
        try:
            conn = await aio_pika.connect(bus.url)
            async with conn:
                channel = await conn.channel()
                exchange = await channel.get_exchange(bus.exchange)
                await exchange.publish(aio_pika.Message(b"hello", headers={"x": 1}), routing_key="ev.foreign")
            events = make_events(3, 1)
            await bus.publish(events)
            got = await drain(b, 4)
            assert got[0].received is None and got[0].error is not None and "CloudEvent" in got[0].error
            assert ids(got[1:]) == [e.id for e in events]
            assert await b.receive(5, 0.3) == []  # the foreign one was acked like the rest
        finally:
            await b.stop()

    async def test_stop_is_idempotent_and_late_acks_are_ignored(self, bus: Bus) -> None:
        """stop() twice is fine, an ack after stop does nothing, and receive after stop is a UsageError."""
        group = new_group()
        b = bus.subscribe(group)
        await b.start()
        await bus.publish(make_events(1, 1))
        (m,) = await drain(b, 1, ack=False)
        await b.stop()
        await b.stop()
        await m.ack()  # ignored: the broker has requeued it
        with pytest.raises(UsageError):
            await b.receive(1, 0.1)
        again = bus.subscribe(group)
        await again.start()
        try:
            assert ids(await drain(again, 1)) == ids([m])
        finally:
            await again.stop()

    async def test_unreachable_broker_at_start_is_retryable(self, bus: Bus) -> None:
        """start() against a closed port raises RetryableError in one line that hides the password."""
        b = bus.subscribe(url=f"amqp://guest:hunter2@127.0.0.1:{free_port()}/")
        with pytest.raises(RetryableError) as info:
            await b.start()
        assert "hunter2" not in str(info.value) and "\n" not in str(info.value)
        await b.stop()

    async def test_missing_exchange_is_permanent(self, rabbitmq_url: str) -> None:
        """Subscribing to an exchange that does not exist fails start with a PermanentError saying how to fix it."""
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=f"or-missing-{uuid.uuid4().hex[:8]}"))
        b = t.subscription(SubscriptionSpec("", group=None))
        with pytest.raises(PermanentError, match="declare_exchange"):
            await b.start()
        await b.stop()


class TestTarget:
    def test_routing_key_template_becomes_a_binding_pattern(self) -> None:
        """Each word of the routing key holding a placeholder becomes '#', and repeated '#' collapse."""
        assert binding_pattern("ev.{stream}") == "ev.#"
        assert binding_pattern("{category}.{type}") == "#"
        assert binding_pattern("t-{tenant}.orders.{type}") == "#.orders.#"
        assert binding_pattern("fixed.key") == "fixed.key"

    def test_target_that_cannot_be_consumed_names_the_option(self) -> None:
        """A templated exchange, or a templated key on a direct exchange, is a PermanentError naming the option."""
        t = RabbitMQTransport(RabbitMQConfig(exchange="ev.{tenant}"), destination="d")
        with pytest.raises(PermanentError, match=r"destinations\.d\.exchange"):
            t.subscription(SubscriptionSpec(""))
        direct = RabbitMQTransport(RabbitMQConfig(exchange_type="direct"), destination="d")
        with pytest.raises(PermanentError, match=r"destinations\.d\.routing_key"):
            direct.subscription(SubscriptionSpec("", group="g"))
        with pytest.raises(PermanentError, match="default exchange"):
            direct.subscription(SubscriptionSpec("/orders"))
        explicit = direct.subscription(SubscriptionSpec("events/orders.*"))
        assert (explicit.exchange, explicit.binding_key) == ("events", "orders.*")  # type: ignore[attr-defined]
