"""The ``memory`` transport: a genuine in-process broker with a reader.

Messages are kept per target in order, with the event, key and the
binary-mode CloudEvents headers a real broker would carry. Useful for tests
and for embedding (``MemoryTransport.broker(name)`` gives the shared store).
Knobs for fault tests: ``fail_next`` (retryable failures),
``reject_types`` (permanent), ``max_message_bytes``, ``dedupe``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from outrelay.kit import (
    Capabilities,
    Delivered,
    Event,
    LifecycleTransport,
    Message,
    Reader,
    Received,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    SubscriptionBackend,
    SubscriptionSpec,
    TransportConfig,
    binary_headers,
    hookimpl,
)
from outrelay.transports._memory_bus import MemoryGroup, MemorySubscription

if TYPE_CHECKING:
    from outrelay.kit import Registry

#: the event carried by a foreign message's Received (never handed to a handler)
_FOREIGN = Event(type="outrelay.foreign", stream="-", source="memory")

__all__ = ["MemoryBroker", "MemoryConfig", "MemoryTransport"]


class MemoryConfig(TransportConfig):
    broker: str = "default"
    target: str = "{type}"
    max_message_bytes: int | None = None
    dedupe: bool = True
    reject_types: tuple[str, ...] = ()
    latency: float = 0.0
    down: bool = False


@dataclasses.dataclass
class MemoryBroker:
    """Per-name in-process broker state. ``statistics()`` for tests."""

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

    def put_foreign(self, target: str, body: bytes, *, key: str = "", reason: str = "no ce-* attributes") -> None:
        """Store a message that is not an outrelay CloudEvent (for dead-letter tests)."""
        r = Received(_FOREIGN, target, key, {}, body, None)
        self.foreign[len(self.log)] = reason
        self.log.append(r)
        self.messages[target].append(r)
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


class MemoryTransport(LifecycleTransport[MemoryConfig]):
    """See the module docstring (open/close rules: :class:`~outrelay.kit.LifecycleTransport`)."""

    name = "memory"
    Config = MemoryConfig
    conformance_unreachable_options: ClassVar[Mapping[str, Any] | None] = {"down": True}
    #: what the conformance suite cannot certify here, and why (see outrelay.conformance.ConformanceTarget)
    conformance_unsupported: ClassVar[Mapping[str, str]] = {
        "processes": "an in-process broker: members in other processes cannot reach it"
    }
    conformance_late_reader_options: ClassVar[Mapping[str, Any] | None] = {"from_beginning": True}
    _brokers: ClassVar[dict[str, MemoryBroker]] = {}
    target_option = "target"

    def __init__(self, config: MemoryConfig | None = None, *, destination: str = "memory") -> None:
        super().__init__(config or MemoryConfig(), destination=destination)

    @classmethod
    def broker(cls, name: str = "default") -> MemoryBroker:
        """The shared state behind every transport configured with ``broker = name``."""
        return cls._brokers.setdefault(name, MemoryBroker())

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=True,
            native_dedupe=self.cfg.dedupe,
            max_batch_count=1000,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
            subscriptions=True,
        )

    async def _open(self) -> None:
        if self.cfg.down or self.broker(self.cfg.broker).down:
            raise RetryableError(f"memory broker {self.cfg.broker!r} is down", destination=self.destination)

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        b = self.broker(self.cfg.broker)
        b.sends += 1
        if self.cfg.latency:
            await asyncio.sleep(self.cfg.latency)
        results: list[SendResult] = []
        failed: set[str] = set()
        for m in batch:
            if m.key in failed:
                results.append(RetryLater("an earlier message with this key failed"))
                continue
            r = self._one(b, m)
            if not isinstance(r, Delivered):
                failed.add(m.key)
            results.append(r)
        b.wake()
        return results

    def _one(self, b: MemoryBroker, m: Message) -> SendResult:
        if b.down or self.cfg.down:
            return RetryLater(f"memory broker {self.cfg.broker!r} is down")
        if b.fail_next > 0:
            b.fail_next -= 1
            return RetryLater("injected failure")
        if m.event.type in self.cfg.reject_types:
            return Rejected(f"type {m.event.type!r} is rejected by configuration")
        limit = self.cfg.max_message_bytes
        if limit is not None and len(m.event.data) > limit:
            return Rejected(f"message of {len(m.event.data)} bytes exceeds max_message_bytes={limit}")
        if self.cfg.dedupe and m.event.id in b.seen:
            return Delivered(duplicate=True)
        b.seen.add(m.event.id)
        headers = binary_headers(m.event)
        r = Received(m.event, m.target, m.key, headers, m.event.data, m.event.content_type)
        b.messages[m.target].append(r)
        b.log.append(r)
        return Delivered()

    async def _close(self) -> None:
        """Nothing to release: the broker lives on for readers and other transports."""

    async def _check(self) -> str:
        return (
            f"in-process broker {self.cfg.broker!r} ({self.broker(self.cfg.broker).statistics()['messages']} messages)"
        )

    def reader(self, target: str, **options: Any) -> Reader:
        """A reader of ``target`` (option ``from_beginning``: every message the broker kept, not only new ones)."""
        return MemoryReader(self.broker(self.cfg.broker), target, from_beginning=bool(options.get("from_beginning")))

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """The in-process bus (see :mod:`outrelay.transports._memory_bus`)."""
        return MemorySubscription(self.broker(self.cfg.broker), spec, broker_name=self.cfg.broker)


class MemoryReader(Reader):
    """Reads messages published to one target after :meth:`start` (``from_beginning``: all of them)."""

    def __init__(self, broker: MemoryBroker, target: str, *, from_beginning: bool = False) -> None:
        self.broker = broker
        self.target = target
        self.from_beginning = from_beginning
        self._pos = 0
        self._event = asyncio.Event()

    async def start(self) -> None:
        self._pos = 0 if self.from_beginning else len(self.broker.messages[self.target])
        self.broker.waiters.append(self._event)

    async def read(self, count: int, timeout: float) -> list[Received]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msgs = self.broker.messages[self.target]
            if len(msgs) - self._pos >= count or loop.time() >= deadline:
                out = msgs[self._pos : self._pos + count]
                self._pos += len(out)
                return out
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=max(0.0, deadline - loop.time()))

    async def stop(self) -> None:
        if self._event in self.broker.waiters:
            self.broker.waiters.remove(self._event)


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    registry.add_transport("memory", MemoryTransport)
