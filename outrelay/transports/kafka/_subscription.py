"""Subscriptions of the ``kafka`` transport: an aiokafka consumer group, or every partition for fan-out.

On the broker: a **group** subscription is one ``AIOKafkaConsumer`` with
``group_id = spec.group`` subscribed to the topic; the broker's group
coordinator assigns partitions and keeps the committed offsets (the group's
position). Nothing else is stored anywhere.

Order across members: the transport keys every record by its stream, so a
stream lives in one partition, and a partition belongs to one member at a
time. A member hands out a partition's records in offset order; acks may
come back out of order across the streams of one partition, so it commits
per partition only the contiguous handled prefix (see ``_offsets.py``),
shortly after the acks (coalesced, every ~0.2 s) and at every rebalance and
stop. On a rebalance (``on_partitions_revoked``, which aiokafka awaits
before re-joining) the member stops handing out records of the revoked
partitions, waits up to ``claim_timeout`` for the ones it handed out to be
acked, then commits: the next owner starts after them and never handles a
record while this member still does — unless a handler outlives
``claim_timeout``, and then the group stays at least once, not exclusive.

A member that stops leaves the group at once (``LeaveGroup``): its
partitions move at the next rebalance, from the last committed offsets, so
its unacked records are handed again. A member that dies (or loses the
broker) is dropped when its session expires: ``claim_timeout`` is the
session timeout (heartbeats every third of it). Stock Kafka accepts
sessions of 6 s to 30 min (``group.min/max.session.timeout.ms``); a
``claim_timeout`` outside the broker's range fails ``start`` permanently.
Records a dead member had acked but not yet committed (its last ~0.2 s) are
handed again too: at least once, the inbox makes it exactly-once.

A new group starts at the end of the topic (``from_beginning``: at its
beginning); ``start`` returns after the member got its assignment, resolved
its positions and committed them, so the group's position is pinned even if
every member stops right away.

**Fan-out** (no group): the consumer assigns itself every partition that
exists at ``start`` and seeks to their end; it commits nothing, and a
subscriber that stops loses its place. ``ack`` does nothing.

Records that are not outrelay CloudEvents come back as ``Inbound(received=None,
error=...)`` and take part in the offset bookkeeping like any other: ack
them once dead-lettered. ``delivery_count`` is always 1 (Kafka does not
count deliveries); ``broker_id`` is ``topic[partition]@offset``. An ack is
local bookkeeping, so it is synchronous (:meth:`Inbound.ack_nowait`); the
awaitable ``ack`` does the same. ``receive`` returns at most
``RECEIVE_CHUNK`` records per call (fewer than asked is within the contract).

:raises RetryableError: from ``start`` when the broker is unreachable, or
    stops answering before the member's assignment and position are
    committed (joining a group gives up after ``connect_timeout + 2 *
    claim_timeout + 10`` s); from ``receive`` when an idle receive finds no
    broker reachable (aiokafka reconnects by itself; the next ``receive``
    resumes). Nothing here waits on the broker without a bound: every commit
    gives up after ``request_timeout`` (aiokafka alone would retry a
    retriable commit error forever), and so does ``stop``.
:raises PermanentError: the topic is a template (subscribe to one rendered
    topic instead), an illegal name, not authorized, or ``claim_timeout`` is
    outside the broker's session range.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka import errors as ke

from outrelay.kit import (
    Inbound,
    PermanentError,
    Received,
    RetryableError,
    SubscriptionBackend,
    SubscriptionSpec,
    Template,
)
from outrelay.transports.kafka._client import client_options, partitions, seek_all
from outrelay.transports.kafka._config import TOPIC_RE, KafkaConfig
from outrelay.transports.kafka._errors import ERRORS, describe
from outrelay.transports.kafka._offsets import PartitionTrack
from outrelay.transports.kafka._wire import decode

__all__ = ["KafkaSubscription", "subscription_for"]

log = logging.getLogger(__name__)

COMMIT_DELAY = 0.2  # seconds acks wait to be committed together: one OffsetCommit per burst, not per record
#: at most this many records per receive. getmany builds all its records at once, about a dozen objects
#: the cyclic GC tracks each; more than its first-generation threshold (700) alive together sets off
#: collections that promote them — and everything in flight with them — to the oldest generation, whose
#: full collections then come more than twice as often. The runtime calls receive again at once (a
#: buffered chunk comes back without yielding), so its lanes see batches as large as before (figures:
#: benchmarks/README.md, "Why the code is as it is").
RECEIVE_CHUNK = 64
_PROBE_EVERY = 1.0  # at most one reachability probe per second of idle receives


def subscription_for(cfg: KafkaConfig, spec: SubscriptionSpec, *, destination: str) -> KafkaSubscription:
    """The backend for ``spec``; ``spec.target == ""`` means the destination's (static) topic.

    :raises PermanentError: the topic is a template — Kafka could consume a
        pattern, but one stream's events may then span topics and their order
        would not hold, so name one rendered topic as the target — or the target
        is not a legal topic name.
    """
    target = spec.target
    if not target:
        if not Template(cfg.topic, where=f"destinations.{destination}.topic").is_static:
            raise PermanentError(
                f"kafka destination {destination!r}: topic {cfg.topic!r} is a template; subscribe to one "
                "rendered topic (SubscriptionSpec target='<topic>'): a pattern subscription would not keep "
                "one stream's events in order across topics",
                destination=destination,
            )
        target = cfg.topic
    if not TOPIC_RE.match(target):
        raise PermanentError(
            f"kafka destination {destination!r}: cannot subscribe to {target!r}: not a Kafka topic name "
            "(letters, digits, '.', '_', '-'; at most 249)",
            destination=destination,
        )
    return KafkaSubscription(cfg, dataclasses.replace(spec, target=target), destination=destination)


class KafkaSubscription(SubscriptionBackend):
    """See the module docstring."""

    def __init__(self, cfg: KafkaConfig, spec: SubscriptionSpec, *, destination: str = "kafka") -> None:
        super().__init__(spec)
        self.cfg = cfg
        self.destination = destination
        self._where = f"kafka subscription to {spec.target!r}" + (f" (group {spec.group!r})" if spec.group else "")
        self._consumer: AIOKafkaConsumer | None = None
        self._tracks: dict[TopicPartition, PartitionTrack] = {}
        self._assigned = asyncio.Event()
        self._acked = asyncio.Event()  # set on every ack: wakes revocation and a full prefetch window
        self._unacked = 0
        self._flush: asyncio.Task[None] | None = None
        self._last_probe = 0.0

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        spec, cfg, group = self.spec, self.cfg, self.spec.group
        session_ms = int(spec.claim_timeout * 1000)
        options: dict[str, Any] = {
            **client_options(cfg),
            "client_id": f"{cfg.client_id}-{spec.member}",
            "group_id": group,
            "enable_auto_commit": False,
            "auto_offset_reset": "earliest" if spec.from_beginning else "latest",
            "max_poll_records": max(1, spec.prefetch),
        }
        if group is not None:
            options.update(
                session_timeout_ms=session_ms,
                heartbeat_interval_ms=max(100, session_ms // 3),
                # the broker waits this long for a member's re-join: revocation may wait claim_timeout for acks
                rebalance_timeout_ms=2 * session_ms + 5000,
                request_timeout_ms=max(options["request_timeout_ms"], session_ms + 5000),
            )
        # a restarted backend starts from scratch: a fresh assignment, nothing outstanding
        self._assigned.clear()
        self._tracks, self._unacked = {}, 0
        where = f"{self._where}: subscribe on {','.join(cfg.servers)}"
        with ERRORS.boundary(where, destination=self.destination):
            consumer = AIOKafkaConsumer(**options)
            try:
                async with asyncio.timeout(cfg.connect_timeout):
                    await consumer.start()
                # metadata first: auto-creates the topic where the broker allows, fails fast where not
                parts = await partitions(consumer, spec.target, cfg.connect_timeout)
                if group is None:
                    assigned = [TopicPartition(spec.target, p) for p in parts]
                    consumer.assign(assigned)
                    await seek_all(consumer, assigned, from_beginning=spec.from_beginning, to_end=True)
                else:
                    consumer.subscribe([spec.target], listener=_Listener(self))
                    self._consumer = consumer
                    # joining may wait out a departed member's session and a rebalance round
                    await self._join(consumer, cfg.connect_timeout + 2 * spec.claim_timeout + 10)
            except ke.InvalidSessionTimeoutError as exc:
                self._consumer = None
                await self._close(consumer)
                raise PermanentError(
                    f"{self._where}: the broker refuses claim_timeout={spec.claim_timeout:g} s as a session timeout "
                    "(stock Kafka: 6-1800 s, group.min/max.session.timeout.ms); choose one in the broker's range",
                    destination=self.destination,
                ) from exc
            except BaseException:
                self._consumer = None
                await self._close(consumer)
                raise
        self._consumer = consumer

    async def _join(self, consumer: AIOKafkaConsumer, budget: float) -> None:
        """Wait for an assignment, resolve its positions and commit them (the group's position is pinned)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + budget
        while True:
            left = deadline - loop.time()
            if left <= 0:
                raise RetryableError(
                    f"{self._where}: did not join the group within {budget:.0f} s (no assignment, or its positions "
                    "not committed); is the broker reachable?"
                )
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._assigned.wait()
            if not self._assigned.is_set():
                continue
            tracks = dict(self._tracks)
            try:
                for tp, track in tracks.items():
                    async with asyncio.timeout(max(0.1, deadline - loop.time())):
                        position = await consumer.position(tp)
                    if track.commit_to is None:
                        track.commit_to = position
                await self._commit(tracks, within=max(0.1, deadline - loop.time()))
                return
            except (ke.CommitFailedError, ke.RebalanceInProgressError, ke.IllegalGenerationError):
                continue  # a rebalance overtook us: the revocation committed what we resolved; join again
            except TimeoutError:
                continue  # the budget ran out resolving or committing positions: say so above

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is None:
            return
        tracks, self._tracks = self._tracks, {}
        for track in tracks.values():
            track.live = False
        if self._flush is not None:
            self._flush.cancel()
        try:
            if self.spec.group is not None:
                with contextlib.suppress(Exception):  # best effort: uncommitted records are redelivered
                    await self._commit(tracks, consumer)
        finally:
            await self._close(consumer)

    async def _close(self, consumer: AIOKafkaConsumer) -> None:
        """Stop ``consumer`` (leaving its group), giving up after ``request_timeout``: a broker that stopped
        answering must not hold ``stop`` (or a failed ``start``) forever. Then what aiokafka's stop left
        running is torn down without the broker (:func:`_abandon`)."""
        try:
            async with asyncio.timeout(self.cfg.request_timeout):
                await consumer.stop()
        except Exception:  # stopping: nothing useful to report
            await _abandon(consumer)

    # -- receiving ---------------------------------------------------------------------------------

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        consumer = self._consumer
        if consumer is None:
            return []
        current = consumer  # a stop() during getmany ends the loop
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Inbound] = []
        grouped = self.spec.group is not None
        with ERRORS.boundary(f"{self._where}: consume", destination=self.destination):
            while not out and self._consumer is current:
                left = deadline - loop.time()
                if left <= 0:
                    break
                room = min(max_messages, self.spec.prefetch - self._unacked) if grouped else max_messages
                if room <= 0:  # the prefetch window is full: wait for an ack
                    self._acked.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left):
                            await self._acked.wait()
                    continue
                timeout_ms = int(min(left, 0.5) * 1000)
                batches = await consumer.getmany(timeout_ms=timeout_ms, max_records=min(room, RECEIVE_CHUNK))
                for tp, records in batches.items():
                    track = self._tracks.get(tp) if grouped else None
                    if grouped and (track is None or not track.live):
                        continue  # revoked meanwhile: the next owner reads them from the committed offset
                    for r in records:
                        try:
                            received = decode(r.topic, r.key, r.value, r.headers)
                        except Exception as exc:  # whatever the decoder finds wrong, the runtime dead-letters it
                            out.append(_Record.foreign(self, tp, track, r, exc))
                        else:
                            out.append(_Record(received, received.event.stream, None, self, tp, track, r.offset))
                    if track is not None:  # every record is handed out, decoded or not: each takes an ack
                        track.hand_all([r.offset for r in records])
                        self._unacked += len(records)
            if not out and timeout > 0:
                await self._probe(consumer)
        return out

    def _ack(self, track: PartitionTrack, offset: int) -> None:
        if not track.ack(offset):
            return
        self._unacked -= 1
        self._acked.set()
        if self._flush is None or self._flush.done():
            self._flush = asyncio.get_running_loop().create_task(self._flush_soon())

    async def _flush_soon(self) -> None:
        await asyncio.sleep(COMMIT_DELAY)
        try:
            await self._commit(self._tracks)
        except Exception as exc:  # a rebalance or a broker hiccup: revocation or the next flush commits
            log.debug("%s: deferred commit failed: %s", self._where, describe(exc))

    async def _probe(self, consumer: AIOKafkaConsumer) -> None:
        """aiokafka retries a lost broker silently; after an idle receive, ask whether one answers."""
        loop = asyncio.get_running_loop()
        if loop.time() - self._last_probe < _PROBE_EVERY:
            return
        self._last_probe = loop.time()
        try:
            async with asyncio.timeout(self.cfg.connect_timeout):
                await consumer.topics()
        except Exception as exc:
            raise RetryableError(
                f"{self._where}: no broker of {','.join(self.cfg.servers)} answers ({describe(exc)}); "
                "the next receive reconnects",
                destination=self.destination,
            ) from exc

    # -- commits and rebalances --------------------------------------------------------------------

    async def _commit(
        self, tracks: dict[TopicPartition, PartitionTrack], consumer: Any = None, *, within: float | None = None
    ) -> None:
        """Commit the handled prefix of ``tracks``' dirty partitions.

        :raises TimeoutError: not done within ``within`` seconds (default ``request_timeout``). aiokafka
            retries a retriable commit error, and looks for the group coordinator again, without end; a
            broker that keeps answering so (or never answers) must not hold a rebalance, ``start``,
            ``stop`` or the flush task forever.
        :raises KafkaError: what aiokafka raises (``CommitFailedError`` after a rebalance, ...).
        """
        consumer = consumer or self._consumer
        todo = {tp: t.commit_to for tp, t in tracks.items() if t.dirty}
        if consumer is None or not todo:
            return
        async with asyncio.timeout(self.cfg.request_timeout if within is None else within):
            await consumer.commit(todo)
        for tp, offset in todo.items():
            tracks[tp].committed = offset

    async def _revoked(self, revoked: set[TopicPartition]) -> None:
        self._assigned.clear()
        tracks = {tp: t for tp, t in self._tracks.items() if tp in revoked}
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.spec.claim_timeout
        while any(t.outstanding for t in tracks.values()) and (left := deadline - loop.time()) > 0:
            self._acked.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(left):
                    await self._acked.wait()
        for tp, track in tracks.items():
            track.live = False
            self._unacked -= track.outstanding
            self._tracks.pop(tp, None)
        late = sum(t.outstanding for t in tracks.values())
        if late:
            log.warning("%s: %d record(s) not acked within claim_timeout; the next owner gets them", self._where, late)
        try:
            await self._commit(tracks)
        except Exception as exc:  # the next owner starts from the previous commit: at least once
            log.warning("%s: commit at rebalance failed: %s", self._where, describe(exc))

    def _assigned_now(self, assigned: set[TopicPartition]) -> None:
        for tp in assigned:
            self._tracks[tp] = PartitionTrack()
        self._assigned.set()


async def _abandon(consumer: AIOKafkaConsumer) -> None:
    """Tear down a consumer whose ``stop()`` the broker did not let finish: cancel its coordinator's tasks
    (the heartbeat would otherwise retry forever), close its fetcher and its connections. These are
    aiokafka's private attributes: a step whose attribute is missing is skipped, none waits on the broker."""
    coordinator = getattr(consumer, "_coordinator", None)
    names = ("_coordination_task", "_heartbeat_task", "_commit_refresh_task")
    tasks = [t for n in names if isinstance(t := getattr(coordinator, n, None), asyncio.Future) and not t.done()]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=1.0)
    for part in (getattr(consumer, "_fetcher", None), getattr(consumer, "_client", None)):
        if part is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(1.0):
                    await part.close()


class _Record(Inbound):
    """One record as handed to the runtime: an :class:`Inbound` that acks synchronously
    (:meth:`ack_nowait`: a group member's ack is bookkeeping in its partition's
    :class:`PartitionTrack`, committed later in bulk; fan-out acks nothing) and
    renders ``broker_id`` (``topic[partition]@offset``) only when it is read — dead
    letters and logs — instead of for every record. ``ack`` is a method here, not a
    per-record closure; ``broker_id`` is read-only."""

    __slots__ = ("_offset", "_sub", "_tp", "_track")

    def __init__(
        self,
        received: Received | None,
        stream: str,
        error: str | None,
        sub: KafkaSubscription,
        tp: TopicPartition,
        track: PartitionTrack | None,
        offset: int,
    ) -> None:
        # not Inbound.__init__: it would assign the ack and broker_id this class computes
        self.received = received
        self.stream = stream
        self.error = error
        self.delivery_count = 1  # Kafka does not count deliveries
        self._sub = sub
        self._tp = tp
        self._track = track
        self._offset = offset

    @classmethod
    def foreign(
        cls, sub: KafkaSubscription, tp: TopicPartition, track: PartitionTrack | None, record: Any, exc: Exception
    ) -> _Record:
        """A record that is not an outrelay CloudEvent (``decode`` raised ``exc``): ordered by its key."""
        key = record.key.decode("utf-8", "replace") if record.key is not None else ""
        m = cls(None, key, None, sub, tp, track, record.offset)
        m.error = f"not an outrelay CloudEvent at {m.broker_id}: {type(exc).__name__}: {str(exc)[:200]}"
        return m

    @property
    def broker_id(self) -> str:
        return f"{self._tp.topic}[{self._tp.partition}]@{self._offset}"

    @broker_id.setter
    def broker_id(self, value: str) -> None:
        raise AttributeError("a Kafka record's broker_id is its topic, partition and offset; it cannot be set")

    async def ack(self) -> None:
        """What :meth:`ack_nowait` does (for callers that await ``ack``)."""
        self.ack_nowait()

    def ack_nowait(self) -> bool:
        """Mark the record handled in its partition's track (committed with the next flush);
        ignored when repeated or once the partition was revoked or the member stopped."""
        if self._track is not None:
            self._sub._ack(self._track, self._offset)
        return True

    def __repr__(self) -> str:
        return f"<Inbound {self.broker_id} stream={self.stream!r}{' error' if self.error else ''}>"


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    """aiokafka awaits these around every rebalance (eager protocol: all partitions are revoked)."""

    def __init__(self, sub: KafkaSubscription) -> None:
        self._sub = sub

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._sub._revoked(set(revoked))

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._sub._assigned_now(set(assigned))
