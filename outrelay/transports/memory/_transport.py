"""The ``memory`` transport: a genuine in-process broker with a reader and subscriptions.

Messages are kept per target in order, with the event, key and the
binary-mode CloudEvents headers a real broker would carry; the broker
(:mod:`._broker`) answers each message as a real one would. Useful for tests and for embedding
(``MemoryTransport.broker(name)`` gives the shared store). Knobs for fault
tests: ``fail_next`` (retryable failures), ``reject_types`` (permanent),
``max_message_bytes``, ``dedupe``, ``latency``, ``down``.

Each message is stored the moment it is sent, so a send records its outcomes
in the relay's progress as it returns, and starts nothing once the relay is
stopping (:func:`~outrelay.kit.send_each`); a cut send (``latency`` longer
than ``attempt_timeout``) stored nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from outrelay.kit import (
    Capabilities,
    LifecycleTransport,
    Message,
    Reader,
    RetryableError,
    SendResult,
    SubscriptionBackend,
    SubscriptionSpec,
    current_progress,
    send_each,
)
from outrelay.transports.memory._broker import MemoryBroker
from outrelay.transports.memory._config import MemoryConfig
from outrelay.transports.memory._reader import MemoryReader
from outrelay.transports.memory._subscription import MemorySubscription

__all__ = ["MemoryTransport"]


class MemoryTransport(LifecycleTransport[MemoryConfig]):
    """Sends to the in-process broker named by ``broker`` (:meth:`broker` gives its shared state);
    see the module docstring, and :class:`~outrelay.kit.LifecycleTransport` for the open/close rules.
    """

    name = "memory"
    Config = MemoryConfig
    target_option = "target"
    conformance_unreachable_options: ClassVar[Mapping[str, Any] | None] = {"down": True}
    #: what the conformance suite cannot certify here, and why (see outrelay.conformance.ConformanceTarget)
    conformance_unsupported: ClassVar[Mapping[str, str]] = {
        "processes": "an in-process broker: members in other processes cannot reach it"
    }
    conformance_late_reader_options: ClassVar[Mapping[str, Any] | None] = {"from_beginning": True}
    _brokers: ClassVar[dict[str, MemoryBroker]] = {}

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
        progress = current_progress()
        results = send_each(batch, lambda m: b.publish(m, self.cfg), progress=progress)
        progress.record(batch, results)
        b.wake()
        return results

    async def _close(self) -> None:
        """Nothing to release: the broker lives on for readers and other transports."""

    async def _check(self) -> str:
        messages = self.broker(self.cfg.broker).statistics()["messages"]
        return f"in-process broker {self.cfg.broker!r} ({messages} messages)"

    def reader(self, target: str, **options: Any) -> Reader:
        """A reader of ``target`` (option ``from_beginning``: every message the broker kept, not only new ones)."""
        return MemoryReader(self.broker(self.cfg.broker), target, from_beginning=bool(options.get("from_beginning")))

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """The in-process bus (see :mod:`outrelay.transports.memory._subscription`)."""
        return MemorySubscription(self.broker(self.cfg.broker), spec, broker_name=self.cfg.broker)
