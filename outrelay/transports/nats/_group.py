"""Consumer groups on JetStream 2.9: shards held by one member at a time.

On the broker, for a group G on target T of stream S (``tag`` = a checksum of
S, T and G):

* ``group_shards`` durable pull consumers ``or_<tag>_s<i>of<P>``, filter T,
  explicit acks, ``ack_wait = claim_timeout``, ``max_ack_pending = prefetch``,
  created by ``start`` when missing (deliver ``new``, or ``all`` with
  ``from_beginning``): the group's position, kept by the server;
* a KV bucket ``or_<tag>`` whose ``max_age`` is ``claim_timeout``: member
  ``m`` keeps ``m.<m>`` alive, the holder of shard i keeps ``s.<i>`` =
  its name alive (renewed every ``claim_timeout / 4`` by an update that
  checks the revision, so two members never both think they hold it).

Each member lists the live members and wants shard i when it is ranked
``i % members`` among them. It takes a wanted shard that is free, and hands
back a shard it no longer wants (a member joined): it stops fetching, naks
the shard's messages it had fetched but not handed on, waits until those it
handed on are acked, and writes the lease as released (empty value). The
next holder then fetches the nak'd messages first (JetStream serves
redeliveries before new messages), in order: no duplicates.

Failover: ``stop`` releases like a hand-back but does not wait — it naks
every unacked message, including those handed on (their acks are ignored
afterwards). A member that dies stops renewing; after ``claim_timeout`` its
leases expire, a live member creates them anew and, as the dead member may
have left unacked messages, re-creates the shard's consumer starting after
its ack floor: those messages come first and in order, followed by some that
were already acked above the floor (duplicates). A member that cannot renew
a lease for ``0.8 * claim_timeout`` (connection down) stops handing on the
shard's messages before the lease can expire. What it handed on earlier may
still be being handled while the next holder starts — the fencing gap every
lease has; keep handlers shorter than ``claim_timeout`` (messages held longer
are kept alive with ``in progress`` acks while the member is healthy).

A delivery lost with a connection shows as a gap in the consumer sequence:
the member then drops the shard's unhanded messages, waits for the handed
ones, and restarts the shard from its ack floor, so order holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import zlib
from collections import deque

import nats.errors
import nats.js.api
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext
from nats.js.kv import KeyValue

from outrelay.kit import Inbound, RetryableError, SubscriptionSpec, TransportError
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._errors import mapped
from outrelay.transports.nats._subscription import NatsBackend, fetch_ready, inbound, sanitize, stream_of

__all__ = ["NatsGroup", "names"]

log = logging.getLogger("outrelay.transports.nats")
_NATS_ERRORS = (TimeoutError, nats.errors.Error, OSError)
FREE, HELD, DRAINING, RESYNC = "free", "held", "draining", "resync"


def names(stream: str, target: str, group: str, shards: int) -> tuple[str, list[str]]:
    """``(kv_bucket, [consumer per shard])`` of a group (tests use it to clean up)."""
    tag = sanitize(f"{stream}\0{target}\0{group}")
    return f"or_{tag}", [f"or_{tag}_s{i}of{shards}" for i in range(shards)]


@dataclasses.dataclass(eq=False)
class _Shard:
    index: int
    consumer: str
    state: str = FREE
    revision: int = 0  # of our lease
    renewed: float = 0.0  # loop time of the last successful lease write
    sub: JetStreamContext.PullSubscription | None = None
    task: asyncio.Task[None] | None = None
    next_dseq: int = 1
    buffered: deque[tuple[Inbound, Msg]] = dataclasses.field(default_factory=deque)
    outstanding: dict[int, tuple[Msg, float]] = dataclasses.field(default_factory=dict)  # stream seq -> msg

    @property
    def key(self) -> str:
        return f"s.{self.index}"


class NatsGroup(NatsBackend):
    """A member of a consumer group (see the module docstring)."""

    def __init__(self, cfg: NatsConfig, destination: str, spec: SubscriptionSpec) -> None:
        super().__init__(cfg, destination, spec)
        assert spec.group is not None
        self.group = spec.group
        self.nshards = self.cfg.group_shards
        self.me = spec.member.encode()
        self._member_key = "m." + sanitize(spec.member)
        self._kv: KeyValue | None = None
        self._bucket = ""
        self._shards: list[_Shard] = []
        self._ticker: asyncio.Task[None] | None = None
        self._ready_evt = asyncio.Event()
        self._room = asyncio.Event()
        self._failure: TransportError | None = None
        self._rr = 0
        self._interval = max(0.05, spec.claim_timeout / 4)

    # -- lifecycle -------------------------------------------------------------

    async def start(self) -> None:
        if self._state != "new":
            return
        await self._start(self._join)
        self._ticker = asyncio.create_task(self._run_ticker(), name=f"nats-group-{self.group}-{self.spec.member}")

    async def _join(self) -> None:
        js = self._js
        assert js is not None
        self._bucket, consumers = names(self.stream, self.target, self.group, self.nshards)
        self._shards = [_Shard(i, c) for i, c in enumerate(consumers)]
        api = nats.js.api
        with mapped(f"cannot set up group {self.group!r} on stream {self.stream!r}", self.destination):
            for shard in self._shards:
                try:
                    await js.consumer_info(self.stream, shard.consumer)
                except nats.js.errors.NotFoundError:
                    policy = api.DeliverPolicy.ALL if self.spec.from_beginning else api.DeliverPolicy.NEW
                    await js.add_consumer(self.stream, self._consumer_config(shard, policy))
            try:
                self._kv = await js.create_key_value(bucket=self._bucket, ttl=self.spec.claim_timeout, history=1)
            except nats.js.errors.BadRequestError:  # exists with another ttl: another member's claim_timeout wins
                self._kv = await js.key_value(self._bucket)
            await self._kv.put(self._member_key, self.me)
        await self._tick()

    def _consumer_config(
        self, shard: _Shard, policy: nats.js.api.DeliverPolicy, start: int | None = None
    ) -> nats.js.api.ConsumerConfig:
        return nats.js.api.ConsumerConfig(
            durable_name=shard.consumer,
            deliver_policy=policy,
            opt_start_seq=start,
            ack_policy=nats.js.api.AckPolicy.EXPLICIT,
            ack_wait=self.spec.claim_timeout,
            max_ack_pending=max(1, self.spec.prefetch),
            filter_subject=self.target,
            max_waiting=16,
        )

    async def _reattach(self) -> None:
        for shard in self._shards:
            await self._lose(shard)
        await super()._reattach()
        await self._join()

    async def stop(self) -> None:
        if self._state == "stopped":
            return
        was, self._state = self._state, "stopped"
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if was == "started" and self._nc is not None and self._nc.is_connected:
            for shard in self._shards:
                if shard.state != FREE:
                    shard.state = DRAINING
                    await self._stop_fetching(shard)
                    for seq in sorted(shard.outstanding):  # redelivered in this order, before anything new
                        with contextlib.suppress(*_NATS_ERRORS):
                            await shard.outstanding[seq][0].nak()
                    shard.outstanding.clear()
                    await self._release(shard)
            with contextlib.suppress(*_NATS_ERRORS):
                if self._kv is not None:
                    await self._kv.delete(self._member_key)
        for shard in self._shards:
            await self._lose(shard)
        await self._close_connection()

    # -- receiving -----------------------------------------------------------

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        await self._ready()
        failure, self._failure = self._failure, None
        if failure is not None:
            raise failure
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            out = self._take_buffered(max_messages)
            left = deadline - loop.time()
            if out or left <= 0 or self._state != "started":
                return out
            self._ready_evt.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready_evt.wait(), left)

    def _take_buffered(self, limit: int) -> list[Inbound]:
        """Round robin over held shards, each shard's messages in order."""
        out: list[Inbound] = []
        live = [s for s in self._shards if s.state == HELD and s.buffered]
        self._rr += 1
        while live and len(out) < limit:
            for shard in list(live):
                if len(out) >= limit:
                    break
                item, msg = shard.buffered.popleft()
                shard.outstanding[msg.metadata.sequence.stream] = (msg, asyncio.get_running_loop().time())
                out.append(item)
                if not shard.buffered:
                    live.remove(shard)
        return out

    def _pending(self) -> int:
        return sum(len(s.buffered) + len(s.outstanding) for s in self._shards)

    def _ack_for(self, shard: _Shard, msg: Msg) -> Inbound:
        seq = msg.metadata.sequence.stream

        async def ack() -> None:
            if self._state == "stopped" or shard.outstanding.pop(seq, None) is None:
                return
            with contextlib.suppress(*_NATS_ERRORS):  # a lost ack means a redelivery, never a loss
                await msg.ack()
            self._room.set()

        return inbound(msg, ack)

    async def _fetch_loop(self, shard: _Shard) -> None:
        """Read the shard's consumer while we hold it; hand on our messages, ack the others."""
        sub = shard.sub
        assert sub is not None
        loop = asyncio.get_running_loop()
        wait = min(1.0, self._interval)
        while shard.state == HELD:
            room = self.spec.prefetch - self._pending()
            if room <= 0:
                self._room.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._room.wait(), wait)
                continue
            if loop.time() - shard.renewed > 0.8 * self.spec.claim_timeout:
                await asyncio.sleep(wait)  # lease not renewed lately: another member may take it over soon
                continue
            try:
                msgs = await fetch_ready(sub, min(room, 256), wait)
            except TimeoutError:
                continue
            except _NATS_ERRORS as exc:
                self._failure = self._error(f"fetch from {shard.consumer!r}", exc)
                self._ready_evt.set()
                await asyncio.sleep(wait)
                continue
            await self._accept(shard, msgs)

    async def _accept(self, shard: _Shard, msgs: list[Msg]) -> None:
        for msg in msgs:
            meta = msg.metadata
            if shard.state not in (HELD, DRAINING):
                return  # lost or restarting: these are delivered again anyway
            # (when draining, they stay buffered, not handed on, and _stop_fetching naks them in order)
            if meta.sequence.consumer != shard.next_dseq:
                log.info(
                    "group %s: shard %d missed a delivery; restarting it from its ack floor", self.group, shard.index
                )
                shard.state = RESYNC  # the fetch loop ends; the ticker restarts the shard
                shard.buffered.clear()
                return
            shard.next_dseq += 1
            if zlib.crc32(stream_of(msg).encode()) % self.nshards != shard.index:
                await msg.ack()  # another shard's message (a publish into the send buffer, no round trip)
                continue
            shard.buffered.append((self._ack_for(shard, msg), msg))
        if shard.buffered:
            self._ready_evt.set()

    # -- shards and leases ---------------------------------------------------

    async def _run_ticker(self) -> None:
        while self._state == "started":
            await asyncio.sleep(self._interval)
            try:
                await self._tick()
            except _NATS_ERRORS as exc:
                self._failure = self._error("lease upkeep", exc)
            except TransportError as exc:
                self._failure = exc

    async def _tick(self) -> None:
        kv, js = self._kv, self._js
        if kv is None or js is None:
            return
        loop = asyncio.get_running_loop()
        for shard in self._shards:  # first renew, so that slow listing below does not cost a lease
            if shard.state != FREE:
                await self._renew(shard)
        await kv.put(self._member_key, self.me)
        members = await self._members(js, kv)
        for shard in self._shards:
            want = members[shard.index % len(members)] == self.spec.member
            if shard.state == HELD and not want:
                shard.state = DRAINING
                await self._stop_fetching(shard)
            if shard.state in (DRAINING, RESYNC) and not shard.outstanding:
                if shard.state == DRAINING:
                    await self._release(shard)
                else:
                    await self._stop_fetching(shard)
                    await self._take(shard, reset=True)
            if shard.state == FREE and want:
                await self._try_take(kv, shard)
        now = loop.time()
        for shard in self._shards:  # keep slow handlers' messages from being redelivered meanwhile
            for seq, (msg, since) in list(shard.outstanding.items()):
                if now - since > self.spec.claim_timeout / 2:
                    shard.outstanding[seq] = (msg, now)
                    await msg.in_progress()

    async def _members(self, js: JetStreamContext, kv: KeyValue) -> list[str]:
        """Live members, sorted (their lease keys exist and are not deleted)."""
        prefix = f"$KV.{self._bucket}."
        info = await js.stream_info(f"KV_{self._bucket}", subjects_filter=prefix + "m.>")
        live = {self.spec.member}
        for subject in info.state.subjects or {}:
            try:
                entry = await kv.get(subject[len(prefix) :])
            except nats.js.errors.NotFoundError:  # deleted (member stopped) or expired
                continue
            if entry.value:
                live.add(entry.value.decode(errors="replace"))
        return sorted(live)

    async def _try_take(self, kv: KeyValue, shard: _Shard) -> None:
        try:
            entry = await kv.get(shard.key)
        except nats.js.errors.NotFoundError:
            entry = None
        try:
            if entry is None:  # never held, or its holder's lease expired: it may have left unacked messages
                shard.revision = await kv.create(shard.key, self.me)
                reset = True
            elif not entry.value or entry.value == self.me:  # released cleanly (or our own stale lease)
                shard.revision = await kv.update(shard.key, self.me, last=entry.revision)
                reset = entry.value == self.me
            else:
                return
        except nats.js.errors.KeyWrongLastSequenceError:
            return  # another member was quicker
        shard.renewed = asyncio.get_running_loop().time()
        shard.state = HELD
        await self._take(shard, reset=reset)

    async def _take(self, shard: _Shard, *, reset: bool) -> None:
        """Start reading a shard we hold; ``reset``: replay from its ack floor what nobody acked."""
        js = self._js
        assert js is not None
        info = await js.consumer_info(self.stream, shard.consumer)
        if reset and info.num_ack_pending:
            start = (info.ack_floor.stream_seq if info.ack_floor else 0) + 1
            await js.delete_consumer(self.stream, shard.consumer)
            policy = nats.js.api.DeliverPolicy.BY_START_SEQUENCE
            await js.add_consumer(self.stream, self._consumer_config(shard, policy, start))
            shard.next_dseq = 1
            log.info(
                "group %s: shard %d taken over by %s from stream seq %d",
                self.group,
                shard.index,
                self.spec.member,
                start,
            )
        else:
            shard.next_dseq = (info.delivered.consumer_seq if info.delivered else 0) + 1
        shard.sub = await js.pull_subscribe_bind(consumer=shard.consumer, stream=self.stream)
        shard.state = HELD
        shard.task = asyncio.create_task(self._fetch_loop(shard))

    async def _renew(self, shard: _Shard) -> None:
        kv = self._kv
        assert kv is not None
        try:
            shard.revision = await kv.update(shard.key, self.me, last=shard.revision)
            shard.renewed = asyncio.get_running_loop().time()
        except nats.js.errors.KeyWrongLastSequenceError:
            log.warning("group %s: %s lost shard %d to another member", self.group, self.spec.member, shard.index)
            await self._lose(shard)
        except _NATS_ERRORS:
            if asyncio.get_running_loop().time() - shard.renewed > 0.8 * self.spec.claim_timeout:
                await self._lose(shard)
            raise

    async def _stop_fetching(self, shard: _Shard) -> None:
        """End the fetch loop (the caller moved the shard out of HELD) and nak, in order, what was
        fetched but not handed on."""
        task, shard.task = shard.task, None
        if task is not None:  # let a running fetch end by itself: its request then expires on the server too
            await asyncio.wait([task], timeout=2 * self._interval + 1.0)
            task.cancel()
        sub, shard.sub = shard.sub, None
        left = [m for _, m in shard.buffered]
        shard.buffered.clear()
        if sub is not None:
            with contextlib.suppress(*_NATS_ERRORS):
                while True:  # deliveries of a request that ended as we stopped
                    left.append(await sub._sub.next_msg(timeout=0.001))
            with contextlib.suppress(*_NATS_ERRORS):
                await sub.unsubscribe()
        for msg in left:
            if msg.headers and msg.headers.get("Status"):
                continue
            with contextlib.suppress(*_NATS_ERRORS):
                await msg.nak()
        if self._nc is not None:
            with contextlib.suppress(*_NATS_ERRORS):
                await self._nc.flush(timeout=2)

    async def _release(self, shard: _Shard) -> None:
        """Hand the lease back as released (empty value): the next holder need not reset."""
        with contextlib.suppress(*_NATS_ERRORS):
            if self._kv is not None and shard.state != FREE:
                await self._kv.update(shard.key, b"", last=shard.revision)
        await self._lose(shard)

    async def _lose(self, shard: _Shard) -> None:
        """Forget the shard locally (its unacked messages go to the next holder)."""
        shard.state = FREE
        task, shard.task = shard.task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, *_NATS_ERRORS, RetryableError):
                await task
        shard.buffered.clear()
        sub, shard.sub = shard.sub, None
        if sub is not None and self._nc is not None and self._nc.is_connected:
            with contextlib.suppress(*_NATS_ERRORS):
                await sub.unsubscribe()
