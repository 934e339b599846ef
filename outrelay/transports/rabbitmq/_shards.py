"""Sharded consumer groups on RabbitMQ: topology, and spreading shards over the live members.

Topology (declared idempotently by every member before ``start`` returns),
for group ``G`` on exchange ``E`` with ``group_shards = N``::

    E ──binding key──▶ outrelay.group.G.E        x-consistent-hash exchange, hash-header = cloudEvents_partitionkey
                          ├──"1"──▶ outrelay.group.G.E.0   durable classic queue (shard 0)
                          ├── ...
                          └──"1"──▶ outrelay.group.G.E.<N-1>
                       outrelay.group.G.E.members           durable queue that nobody publishes to

A stream's messages all hash to one shard, in publish order. Every member
consumes the ``members`` queue (so its consumer count is the number of live
members, kept by the broker) and holds about ``ceil(N / members)`` shards,
each consumed *exclusively* (``basic.consume exclusive``): the broker lets
one member at a time consume a shard, which is what keeps a stream's order
across members. A :class:`Balancer` tick (every ``min(1 s, claim_timeout / 3)``)
compares what the member holds with its share: it claims free shards (a
passive declare shows no consumer) or releases its excess. Releasing drains
first — the shard's messages stop being handed out, those handed out are
waited for until acked (at most ``claim_timeout``; else the release is
abandoned and the held-back messages are handed out after all) — and only
then closes the shard's channel, so the broker requeues the undelivered rest
at its place and the next holder starts exactly after the last acked one.
A dead member's channels close with its connection: its unacked messages go
back to their shard's head, and the survivors claim the shard at their next
tick. A message without the partition-key header (not outrelay's) always
hashes to the same shard.

Caveats. The plugin keeps its hash ring in memory and rebuilds it from the
bindings when the broker restarts; a restart can move a stream to another
shard while older messages of it wait in the first one (order across a
broker restart is then not guaranteed for messages already queued). For the
same reason change ``group_shards`` of an existing group only while its
queues are empty (more shard queues re-map streams; ``1`` uses another,
single queue and leaves the shards behind). A member's prefetch is split
over its shards when it claims them (``ceil(prefetch / share)`` each), so
while the share grows (members left) it may hold somewhat more than
``prefetch`` unacked messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import zlib

import aio_pika.abc
import aiormq.exceptions
from aiormq.abc import FieldValue

from outrelay.transports.rabbitmq._errors import VENDOR_ERRORS
from outrelay.transports.rabbitmq._lanes import Lane, Link

__all__ = ["HASH_HEADER", "Balancer", "declare_shards", "queue_arguments"]

log = logging.getLogger("outrelay.transports.rabbitmq")
HASH_HEADER = "cloudEvents_partitionkey"


def queue_arguments(queue_type: str) -> dict[str, FieldValue]:
    """The ``x-`` arguments of a group's message queues: none for classic ones; a quorum queue is
    declared ``x-queue-type = quorum`` with ``x-single-active-consumer`` (one member at a time even
    without exclusive consume)."""
    if queue_type == "quorum":
        return {"x-queue-type": "quorum", "x-single-active-consumer": True}
    return {}


async def declare_shards(
    channel: aio_pika.abc.AbstractChannel, base: str, exchange: str, key: str, n: int, queue_type: str = "classic"
) -> None:
    """Declare and bind the hash exchange, the ``n`` shard queues (``queue_type``) and the members
    queue (idempotent; PRECONDITION_FAILED when they exist with other arguments)."""
    hashing = await channel.declare_exchange(
        base, "x-consistent-hash", durable=True, arguments={"hash-header": HASH_HEADER}
    )
    await hashing.bind(exchange, key)
    for i in range(n):
        queue = await channel.declare_queue(f"{base}.{i}", durable=True, arguments=queue_arguments(queue_type))
        await queue.bind(hashing, "1")
    await channel.declare_queue(f"{base}.members", durable=True)


class Balancer:
    """Holds this member's share of a group's shards on ``link`` (see the module docstring)."""

    def __init__(self, link: Link, base: str, shards: int, member: str, prefetch: int, claim_timeout: float) -> None:
        self.link = link
        self.base = base
        self.shards = shards
        self.prefetch = prefetch
        self.claim_timeout = claim_timeout
        self.interval = min(1.0, claim_timeout / 3)
        self.first = zlib.crc32(member.encode()) % shards  # members start probing at different shards
        self._task: asyncio.Task[None] | None = None

    async def join(self) -> None:
        """Register as a member and take a first share (before ``start`` returns)."""
        members = await self.link.control.get_queue(f"{self.base}.members", ensure=False)
        await members.consume(_ignore, no_ack=True)
        await self.tick()
        self._task = asyncio.create_task(self._run(), name=f"outrelay rabbitmq balancer {self.base}")

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        while self.link.lost is None:
            await asyncio.sleep(self.interval)
            try:
                await self.tick()
            except (*VENDOR_ERRORS, RuntimeError) as exc:  # a lost connection is reported by the link's callbacks
                log.debug("group %s: balancing failed: %s", self.base, type(exc).__name__)

    async def tick(self) -> None:
        control = self.link.control
        members = await control.declare_queue(f"{self.base}.members", passive=True)
        count = max(1, members.declaration_result.consumer_count or 0)
        share = math.ceil(self.shards / count)
        # keep the busiest shards, release the idlest (a parked stream's shard cannot drain)
        held = sorted((lane for lane in self.link.lanes.values() if not lane.closed), key=lambda x: -x.outstanding)
        if len(held) > share:
            await asyncio.gather(*(self._release(lane) for lane in held[share:]))
            return
        for step in range(self.shards):
            if len(self.link.lanes) >= share or self.link.lost is not None:
                break
            name = f"{self.base}.{(self.first + step) % self.shards}"
            if name in self.link.lanes:
                continue
            probe = await control.declare_queue(name, passive=True)
            if probe.declaration_result.consumer_count:
                continue
            try:
                await self.link.consume(name, max(1, math.ceil(self.prefetch / share)), exclusive=True)
            except aiormq.exceptions.ChannelAccessRefused:
                continue  # another member claimed it since the probe

    async def _release(self, lane: Lane) -> None:
        lane.draining = True
        if lane.outstanding:
            lane.drained.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(lane.drained.wait(), self.claim_timeout)
        if lane.outstanding or lane.closed or self.link.lost is not None:
            lane.draining = False  # a handler holds one (a parked stream?): keep it; receive hands out lane.held
            return
        await self.link.release(lane)


async def _ignore(_message: aio_pika.abc.AbstractIncomingMessage) -> None:
    """The members queue carries no messages; its consumer only counts this member."""
