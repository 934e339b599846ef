"""The state of one in-process broker, shared by every memory transport, reader and subscription
configured with its name.

Messages are kept per target in order (:attr:`MemoryBroker.messages`) and
once more in send order (:attr:`MemoryBroker.log`, what subscriptions read),
each as the :class:`~outrelay.kit.Received` a real broker would hand back:
event, target, key, binary-mode CloudEvents headers, body.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict, deque

from outrelay.kit import Delivered, Event, Message, Received, Rejected, RetryLater, SendResult, binary_headers
from outrelay.transports.memory._config import MemoryConfig

__all__ = ["MemoryBroker", "MemoryGroup"]

#: the event carried by a foreign message's Received (never handed to a handler)
_FOREIGN = Event(type="outrelay.foreign", stream="-", source="memory")


@dataclasses.dataclass
class MemoryGroup:
    """Shared state of one consumer group on one memory broker (see :mod:`._subscription`)."""

    position: int
    returned: deque[int] = dataclasses.field(default_factory=deque)  # handed back by stopped members
    owner: dict[str, str] = dataclasses.field(default_factory=dict)  # stream -> member
    unacked: dict[str, int] = dataclasses.field(default_factory=dict)  # stream -> count
    queues: dict[str, deque[int]] = dataclasses.field(default_factory=dict)  # member -> log indexes
    held: dict[str, set[int]] = dataclasses.field(default_factory=dict)  # member -> handed out, unacked


@dataclasses.dataclass
class MemoryBroker:
    """Per-name in-process broker state. ``statistics()`` for tests; knobs for fault tests:
    ``fail_next`` (that many RetryLater results), ``down`` (unreachable)."""

    messages: dict[str, list[Received]] = dataclasses.field(default_factory=lambda: defaultdict(list))
    seen: set[str] = dataclasses.field(default_factory=set)
    fail_next: int = 0
    down: bool = False
    sends: int = 0
    waiters: list[asyncio.Event] = dataclasses.field(default_factory=list)
    #: every stored message in send order (subscriptions read it), foreign ones by log index
    log: list[Received] = dataclasses.field(default_factory=list)
    foreign: dict[int, str] = dataclasses.field(default_factory=dict)
    groups: dict[tuple[str, str], MemoryGroup] = dataclasses.field(default_factory=dict)

    def wake(self) -> None:
        for w in self.waiters:
            w.set()

    def store(self, r: Received) -> None:
        """Keep ``r`` under its target and in the log (readers are woken by :meth:`wake`)."""
        self.messages[r.target].append(r)
        self.log.append(r)

    def publish(self, m: Message, cfg: MemoryConfig) -> SendResult:
        """Store ``m`` as a destination configured with ``cfg`` sends it, and answer as a broker would:
        RetryLater while down or for an injected failure, Rejected for a type in ``reject_types`` or
        data over ``max_message_bytes``, ``Delivered(duplicate=True)`` for an id seen (``dedupe``)."""
        if self.down or cfg.down:
            return RetryLater(f"memory broker {cfg.broker!r} is down")
        if self.fail_next > 0:
            self.fail_next -= 1
            return RetryLater("injected failure")
        if m.event.type in cfg.reject_types:
            return Rejected(f"type {m.event.type!r} is rejected by configuration")
        limit = cfg.max_message_bytes
        if limit is not None and len(m.event.data) > limit:
            return Rejected(f"message of {len(m.event.data)} bytes exceeds max_message_bytes={limit}")
        if cfg.dedupe and m.event.id in self.seen:
            return Delivered(duplicate=True)
        self.seen.add(m.event.id)
        self.store(Received(m.event, m.target, m.key, binary_headers(m.event), m.event.data, m.event.content_type))
        return Delivered()

    def put_foreign(self, target: str, body: bytes, *, key: str = "", reason: str = "no ce-* attributes") -> None:
        """Store a message that is not an outrelay CloudEvent (for dead-letter tests)."""
        r = Received(_FOREIGN, target, key, {}, body, None)
        self.foreign[len(self.log)] = reason
        self.store(r)
        self.wake()

    def all(self) -> list[Received]:
        return [m for msgs in self.messages.values() for m in msgs]

    def statistics(self) -> dict[str, int]:
        return {"targets": len(self.messages), "messages": sum(map(len, self.messages.values())), "sends": self.sends}

    def clear(self) -> None:
        self.messages.clear()
        self.seen.clear()
        self.log.clear()
        self.foreign.clear()
        self.groups.clear()
        self.fail_next = 0
        self.down = False
