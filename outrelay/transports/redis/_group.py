"""The consumer-group backend of the ``redis`` transport (see :mod:`._subscriber` for the contract
and :mod:`._gate` for the per-stream gate).

State a member keeps locally, all of it recoverable from Redis: ``_held``
(entries delivered to it and waiting at the gate, per event stream, in id
order), ``_mine`` (entries handed over or ready to go, not acked yet) and
``_ready`` (released, not yet returned by ``receive``). Together they are
the member's unacked entries, capped at ``spec.prefetch``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from typing import Any

from redis import exceptions as rx

from outrelay.kit import Inbound, PermanentError, SubscriptionSpec, TransportError
from outrelay.transports.redis import _gate
from outrelay.transports.redis._config import RedisConfig
from outrelay.transports.redis._subscriber import RedisSubscriber, text, to_inbound

__all__ = ["RedisGroup"]

log = logging.getLogger("outrelay.transports.redis")

HANDOVER_IDLE_MS = 10**12  # "idle since 1990": claimable by any XAUTOCLAIM at once
CLAIM_SLACK = 16  # entries a member may claim beyond prefetch
BLOCKED_POLL = 0.01  # seconds between gate checks while an entry waits for another member's ack


class RedisGroup(RedisSubscriber):
    """A member of a Redis Streams consumer group with a per-stream gate."""

    def __init__(self, cfg: RedisConfig, spec: SubscriptionSpec, key: str, *, destination: str) -> None:
        super().__init__(cfg, spec, key, destination=destination)
        assert spec.group is not None
        self.group: str = spec.group
        self.member = spec.member
        try:
            self._prefix = _gate.gate_prefix(key, self.group, cluster=cfg.cluster)
        except ValueError as exc:
            raise PermanentError(str(exc), destination=destination) from None
        self._held: dict[str, list[tuple[str, Inbound]]] = {}  # event stream -> waiting entries, ascending ids
        self._mine: dict[str, str] = {}  # entry id -> event stream: released, not acked
        self._ready: list[Inbound] = []
        self._blocked_since: dict[str, float] = {}
        self._wait_from = ""  # the stream's last id when the last read found nothing new
        self._claim_at = 0.0
        self._claim_cursor = "0-0"
        self._claim_every = min(1.0, spec.claim_timeout / 3)
        self._acks: list[tuple[str, str, asyncio.Future[None]]] = []
        self._ack_task: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None
        self._scripts: dict[str, Any] = {}

    # -- lifecycle -------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is not None:
            return
        client = await self._open()
        try:
            with self._errors(f"XGROUP CREATE {self.group!r}"):
                await self._create_group(client)
        except BaseException:
            await client.aclose()
            raise
        for name in ("READ", "ACK", "REFRESH", "REPAIR", "FORGET"):
            self._scripts[name] = client.register_script(getattr(_gate, name))
        self._client, self._stopped = client, False
        self._heartbeat = asyncio.create_task(self._refresh_loop(), name=f"{self!r} heartbeat")

    async def _create_group(self, client: Any) -> None:
        try:
            await client.xgroup_create(self.key, self.group, id="0" if self.spec.from_beginning else "$", mkstream=True)
        except rx.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):  # an existing group resumes where it was
                raise

    async def stop(self) -> None:
        client, self._client = self._client, None
        self._stopped = True
        if client is None:
            return
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            with contextlib.suppress(BaseException):
                await self._heartbeat
        if self._ack_task is not None:  # let acks already sent finish: they are not handed over then
            with contextlib.suppress(BaseException):
                await self._ack_task
        for _, _, done in self._acks:  # never sent (the flush task failed): left to be claimed again
            if not done.done():
                done.set_result(None)
        self._acks.clear()
        ids = self._unacked_ids()
        try:
            with self._errors("XCLAIM (handover)"):
                if ids:
                    await self._scripts["REFRESH"](
                        keys=[self.key], args=[self.group, self.member, HANDOVER_IDLE_MS, *ids], client=client
                    )
                await self._scripts["FORGET"](keys=[self.key], args=[self.group, self.member], client=client)
        except TransportError as exc:  # the entries become claimable after claim_timeout anyway
            log.warning("%r: could not hand over %d unacked entries at stop: %s", self, len(ids), exc)
        finally:
            self._held.clear()
            self._mine.clear()
            self._ready.clear()
            await client.aclose()

    def _unacked_ids(self) -> list[str]:
        return [*self._mine, *(i for waiting in self._held.values() for i, _ in waiting)]

    # -- receive ---------------------------------------------------------------------------------------------

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        client = self._live()
        if client is None or max_messages <= 0:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(0.0, timeout)
        async with self._receiving(client, f"XREADGROUP {self.group!r}"):
            while self._client is client:  # until stop() (which hands over what this member holds)
                if not self._ready:
                    await self._fill(client, max_messages)
                if self._client is not client:  # stopped meanwhile: entries it read are claimed by others
                    break
                if self._ready:
                    out, self._ready = self._ready[:max_messages], self._ready[max_messages:]
                    return out
                left = deadline - loop.time()
                if left <= 0:
                    return []
                await self._wait(client, left)
        return []

    async def _fill(self, client: Any, max_messages: int) -> None:
        """Read new entries, claim idle ones, and release what the gate lets through."""
        snapshots: dict[str, list[str]] = {}
        room = self.spec.prefetch - len(self._mine) - sum(map(len, self._held.values()))
        if room > 0:
            try:
                reply = await self._scripts["READ"](
                    keys=[self.key],
                    args=[self.group, self.member, min(room, max_messages), self._prefix],
                    client=client,
                )
            except rx.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                log.warning("%r: the group vanished (deleted, or Redis lost its data); creating it again", self)
                await self._create_group(client)
                return
            entries, snapshots, self._wait_from = _gate.unpack_read(reply)
            for entry_id, fields, stream in entries:
                self._add(entry_id, fields, stream)
            room -= len(entries)
        # even when full: the entries that block a full member's held ones may be a dead member's, which
        # only a claim frees (so a member may hold up to prefetch + CLAIM_SLACK entries while it takes over)
        claimable = room if room > 0 else room + CLAIM_SLACK
        if claimable > 0 and time.monotonic() >= self._claim_at:
            await self._claim(client, claimable)
        await self._release(client, snapshots)

    def _add(self, entry_id: str, fields: Any, stream: str, delivery_count: int = 1) -> None:
        ack = functools.partial(self._ack, entry_id, stream)
        inbound = to_inbound(self.key, entry_id, fields, ack=ack, delivery_count=delivery_count)
        if not stream:  # not gated (no ordering key): free to go
            self._mine[entry_id] = stream
            self._ready.append(inbound)
            return
        waiting = self._held.setdefault(stream, [])
        waiting.append((entry_id, inbound))
        if len(waiting) > 1 and _gate.id_order(waiting[-2][0]) > _gate.id_order(entry_id):  # a claimed one
            waiting.sort(key=lambda w: _gate.id_order(w[0]))

    async def _release(self, client: Any, snapshots: dict[str, list[str]]) -> None:
        missing = [s for s in self._held if s not in snapshots]
        if missing:
            async with client.pipeline(transaction=False) as pipe:
                for stream in missing:
                    pipe.lrange(self._prefix + stream, 0, -1)
                for stream, items in zip(missing, await pipe.execute(), strict=True):
                    snapshots[stream] = [text(x) for x in items]
        now = time.monotonic()
        before = len(self._ready)
        for stream in list(self._held):
            waiting = self._held[stream]
            snapshot = snapshots[stream]
            n = _gate.releasable([i for i, _ in waiting], self._mine, snapshot)
            for entry_id, inbound in waiting[:n]:
                self._mine[entry_id] = stream
                self._ready.append(inbound)
            del waiting[:n]
            if not waiting:
                del self._held[stream]
                self._blocked_since.pop(stream, None)
                continue
            since = self._blocked_since.setdefault(stream, now)
            if now - since >= self.spec.claim_timeout:  # blocked that long: maybe by an id no longer pending
                self._blocked_since[stream] = now
                await self._repair(client, stream, waiting[0][0], snapshot)
        if len(self._ready) > before:  # streams were released one after another: hand them over in id order
            self._ready.sort(key=lambda m: _gate.id_order(m.broker_id))

    async def _repair(self, client: Any, stream: str, first: str, snapshot: list[str]) -> None:
        below = _gate.id_order(first)
        suspects = [i for i in snapshot if i not in self._mine and _gate.id_order(i) < below]
        if suspects:
            n = await self._scripts["REPAIR"](
                keys=[self.key], args=[self.group, self._prefix + stream, *suspects], client=client
            )
            if n:
                log.warning("%r: dropped %d gate ids of stream %r that were no longer pending", self, n, stream)

    async def _claim(self, client: Any, room: int) -> None:
        """``XAUTOCLAIM`` entries idle for ``claim_timeout`` (a dead or stopped member's)."""
        reply = await client.xautoclaim(
            self.key,
            self.group,
            self.member,
            min_idle_time=int(self.spec.claim_timeout * 1000),
            start_id=self._claim_cursor,
            count=min(room, 100),
        )
        self._claim_cursor = text(reply[0])
        # a full pass over the pending entries ends at 0-0: pause; else go on at the next read
        self._claim_at = time.monotonic() + (self._claim_every if self._claim_cursor == "0-0" else 0.0)
        claimed = [(text(i), f) for i, f in reply[1] if i is not None and f is not None]
        held = {i for waiting in self._held.values() for i, _ in waiting}
        claimed = [(i, f) for i, f in claimed if i not in self._mine and i not in held]
        if not claimed:
            return
        counts = {
            text(p["message_id"]): int(p["times_delivered"])
            for p in await client.xpending_range(
                self.key,
                self.group,
                min=claimed[0][0],
                max=claimed[-1][0],
                count=len(claimed) + len(held) + 10,
                consumername=self.member,
            )
        }
        for entry_id, fields in claimed:
            self._add(entry_id, fields, _gate.ordering_key(fields), counts.get(entry_id, 2))
        log.info("%r: claimed %d entries idle for %.1fs or more", self, len(claimed), self.spec.claim_timeout)

    async def _wait(self, client: Any, left: float) -> None:
        """Wait for a new entry (``XREAD BLOCK``, consuming nothing) or, while entries wait at
        the gate, a short poll; never past the next claim pass."""
        left = min(left, self._max_block, max(0.001, self._claim_at - time.monotonic()))
        if self._held:
            left = min(left, BLOCKED_POLL)
        full = len(self._mine) + sum(map(len, self._held.values())) >= self.spec.prefetch
        if full or not self._wait_from:  # nothing to read now, or entries read that wait at the gate
            await asyncio.sleep(left)
            return
        await client.xread({self.key: self._wait_from}, count=1, block=max(1, int(left * 1000)))

    # -- ack and heartbeat ----------------------------------------------------------------------------------

    def _ack(self, entry_id: str, stream: str) -> asyncio.Future[None]:
        """XACK + LREM, coalesced with the acks that arrive while one is in flight.

        A plain function returning a future (not a coroutine): the ack is queued
        when called, and ``gather`` over many acks makes no task per ack. The
        future fails with the :class:`TransportError` of its batch; cancelling
        it (its awaiter was cancelled) does not take the ack back.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._client is None or entry_id not in self._mine:
            done.set_result(None)  # after stop (handed over), or acked already
            return done
        self._acks.append((entry_id, stream, done))
        if self._ack_task is None or self._ack_task.done():
            self._ack_task = asyncio.create_task(self._flush_acks(self._client))
        return done

    async def _flush_acks(self, client: Any) -> None:
        # stop() waits for this task before it closes the client
        while self._acks and client is not None:
            batch, self._acks = self._acks, []
            args: list[str] = [self.group, self._prefix]
            for entry_id, stream, _ in batch:
                args += (entry_id, stream)
            try:
                with self._errors("XACK"):
                    await self._scripts["ACK"](keys=[self.key], args=args, client=client)
            except TransportError as exc:
                for _, _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                        done.exception()  # retrieved: an ack nobody awaits logs nothing at garbage collection
            else:
                for _, _, done in batch:
                    if not done.done():
                        done.set_result(None)
            # acked, or left to be claimed again after claim_timeout (no longer refreshed): at least once
            for entry_id, _, _ in batch:
                self._mine.pop(entry_id, None)

    async def _refresh_loop(self) -> None:
        while True:
            await asyncio.sleep(self.spec.claim_timeout / 3)
            client, ids = self._client, self._unacked_ids()
            if client is None or not ids:
                continue
            try:
                with self._errors("XCLAIM (refresh)"):
                    lost = await self._scripts["REFRESH"](
                        keys=[self.key], args=[self.group, self.member, 0, *ids], client=client
                    )
            except TransportError as exc:
                log.warning("%r: could not refresh %d held entries: %s", self, len(ids), exc)
                continue
            # a held id no longer ours was claimed by another member while this one stalled: not ours to hand
            # over any more. (A released id missing from the pending list was usually just acked meanwhile.)
            gone = {text(i) for i in lost}.intersection(i for waiting in self._held.values() for i, _ in waiting)
            if gone:
                for stream in list(self._held):
                    self._held[stream] = [w for w in self._held[stream] if w[0] not in gone]
                    if not self._held[stream]:
                        del self._held[stream]
                log.warning(
                    "%r: %d held entries were claimed by another member (stalled > claim_timeout)", self, len(gone)
                )
