"""Subscriptions of the ``memory`` transport: the in-process bus.

Same semantics as the broker backends, deterministic, for unit tests and
single-process applications. Every message a memory broker stores is also
kept in its ``log`` in send order; a subscription reads the log, keeping the
messages whose target matches ``spec.target`` (a glob; ``""`` = all).

* **Group**: the group holds one shared position in the log. A stream is
  *owned* by the member holding unacked messages of it; further messages of
  an owned stream go to their owner's queue, a free stream to the least
  loaded member — so one stream is never with two members at once
  (contract #2) and the work is shared. When a
  member stops, its unacked messages go back to the group (in log order,
  ahead of everything not yet handed out) and the next member to receive
  takes them: in-process there is no crash to detect, so ``claim_timeout``
  does not apply.
* **Fan-out**: a private position, at the log's end at ``start``.

Foreign (non-CloudEvent) messages can be put on a broker with
:meth:`~outrelay.transports.memory.MemoryBroker.put_foreign`, for tests of dead-lettering.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from fnmatch import fnmatchcase

from outrelay.kit import Inbound, Received, RetryableError, SubscriptionBackend, SubscriptionSpec
from outrelay.transports.memory._broker import MemoryBroker, MemoryGroup

__all__ = ["MemorySubscription"]

_Ack = Callable[[], Awaitable[None]]


class MemorySubscription(SubscriptionBackend):
    """See the module docstring."""

    def __init__(self, broker: MemoryBroker, spec: SubscriptionSpec, *, broker_name: str) -> None:
        super().__init__(spec)
        self.broker = broker
        self.broker_name = broker_name
        self._pattern = spec.target or "*"
        self._wakeup = asyncio.Event()
        self._group: MemoryGroup | None = None
        self._position = 0
        self._running = False

    async def start(self) -> None:
        if self.broker.down:
            raise RetryableError(f"memory broker {self.broker_name!r} is down")
        s = self.spec
        if s.group is not None:
            key = (self._pattern, s.group)
            group = self.broker.groups.get(key)
            if group is None:
                group = self.broker.groups[key] = MemoryGroup(0 if s.from_beginning else len(self.broker.log))
            group.queues.setdefault(s.member, deque())
            group.held.setdefault(s.member, set())
            self._group = group
        else:
            self._position = 0 if s.from_beginning else len(self.broker.log)
        self.broker.waiters.append(self._wakeup)
        self._running = True

    def _matches(self, r: Received) -> bool:
        return self._pattern == "*" or fnmatchcase(r.target, self._pattern)

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._running:
            if self.broker.down:
                raise RetryableError(f"memory broker {self.broker_name!r} is down")
            out = self._take_group(max_messages) if self._group is not None else self._take_fanout(max_messages)
            left = deadline - loop.time()
            if out or left <= 0:
                return out
            self._wakeup.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wakeup.wait(), left)
        return []

    def _take_fanout(self, limit: int) -> list[Inbound]:
        log, out = self.broker.log, list[Inbound]()
        while self._position < len(log) and len(out) < limit:
            r = log[self._position]
            self._position += 1
            if self._matches(r):
                out.append(self._inbound(r, self._position - 1, None))
        return out

    def _take_group(self, limit: int) -> list[Inbound]:
        g, me, log = self._group, self.spec.member, self.broker.log
        assert g is not None
        mine = g.queues[me]
        budget = self.spec.prefetch - len(g.held[me])

        def assign(i: int) -> None:
            stream = log[i].key or ""
            owner = g.owner.get(stream)
            if owner is None or owner not in g.queues:  # a free stream goes to the least loaded member
                owner = min(g.queues, key=lambda m: (len(g.queues[m]) + len(g.held[m]), m != me))
                g.owner[stream] = owner
            g.unacked[stream] = g.unacked.get(stream, 0) + 1
            g.queues[owner].append(i)
            if owner != me:
                self.broker.wake()

        while g.returned and len(mine) < budget:
            assign(g.returned.popleft())
        while g.position < len(log) and len(mine) < budget:
            i = g.position
            g.position += 1
            if self._matches(log[i]):
                assign(i)
        out: list[Inbound] = []
        while mine and len(out) < min(limit, budget):
            i = mine.popleft()
            g.held[me].add(i)
            out.append(self._inbound(log[i], i, g))
        return out

    def _inbound(self, r: Received, index: int, group: MemoryGroup | None) -> Inbound:
        stream = r.key or ""
        foreign = self.broker.foreign.get(index)
        ack = self._acker(index, stream, group) if group is not None else _no_ack
        if foreign is not None:
            return Inbound(None, stream, ack, error=foreign, broker_id=str(index))
        return Inbound(r, stream, ack, broker_id=str(index))

    def _acker(self, index: int, stream: str, g: MemoryGroup) -> _Ack:
        me = self.spec.member

        async def ack() -> None:
            held = g.held.get(me)
            if held is None or index not in held:  # stopped meanwhile: the message went back to the group
                return
            held.discard(index)
            left = g.unacked[stream] = g.unacked[stream] - 1
            if left == 0:
                del g.unacked[stream]
                g.owner.pop(stream, None)

        return ack

    async def stop(self) -> None:
        if not self._running:
            return
        self._running = False
        with contextlib.suppress(ValueError):
            self.broker.waiters.remove(self._wakeup)
        g, self._group = self._group, None
        if g is None:
            return
        me = self.spec.member
        back = sorted(g.held.pop(me, set()) | set(g.queues.pop(me, ())))
        for i in back:
            stream = self.broker.log[i].key or ""
            g.unacked[stream] -= 1
            if g.unacked[stream] == 0:
                del g.unacked[stream]
        for stream in [s for s, owner in g.owner.items() if owner == me]:
            del g.owner[stream]
        g.returned = deque(sorted([*g.returned, *back]))
        self.broker.wake()


async def _no_ack() -> None:
    pass
