"""The subscription contract: what a transport implements to offer subscribers.

A transport that can be consumed as an event bus declares
``capabilities.subscriptions = True`` and returns a
:class:`SubscriptionBackend` from :meth:`Transport.subscription`. The
subscriber runtime (:mod:`outrelay.core.consumer.bus`) drives it; the backend only
speaks to its broker, using the broker's own group and fan-out mechanics::

    backend = transport.subscription(SubscriptionSpec(target="orders", group="billing", member="w1"))
    await backend.start()                  # positions resolved: nothing published from now on is missed
    while running:
        for m in await backend.receive(100, timeout=1.0):
            ...handle m.received.event...
            await m.ack()                  # handled (or dead-lettered): the group never sees it again
    await backend.stop()

Guarantees a backend gives the runtime.

**Group** (``spec.group`` set) — competing consumers, position kept by the broker:

1. Each message is handed to one member of the group. It is handed again
   (to this or another member) only if it was not acked and its member
   stopped, crashed or lost its connection; then it reaches a live member
   within about ``spec.claim_timeout`` seconds. One exception every broker
   has: a live member that holds a message unacked for longer than
   ``claim_timeout`` may see it handed to another member too (a Kafka
   rebalance, a Redis XAUTOCLAIM, a JetStream ack wait); handlers that can
   take that long need an :class:`~outrelay.Inbox` or an idempotent effect.
2. ``receive`` returns the messages of one ordering key (the event's stream)
   in stream order. It never returns message k+1 of a stream while message
   k of that stream was handed to *another* member and is not acked yet
   (cross-member order: partitions, single active consumers, a per-stream
   gate — whatever the broker allows; the backend's docstring says which).
   The runtime, for its part, handles one stream's messages in the order
   received, one at a time, and acks each after its handler finished.
3. The group's position survives every member's restart: a new group starts
   at the end of the target (``spec.from_beginning``: at its beginning), an
   existing one where it was. The position is resolved before ``start``
   returns.
4. A member holds at most ``spec.prefetch`` unacked messages.

**Fan-out** (``spec.group`` None) — every subscriber sees every message
published after ``start`` returned, in stream order; nothing is kept for it
when it stops; ``ack`` may do nothing.

Both: ``receive`` waits at most ``timeout`` seconds and may return fewer
messages than asked (none at all on timeout). A message that is not an
outrelay CloudEvent comes back as an :class:`Inbound` with ``received=None``
and ``error`` saying why — never as an exception. Vendor exceptions never
escape: :class:`~outrelay.RetryableError` (broker unreachable, connection
lost: the runtime backs off and calls ``receive`` again; the backend
reconnects by itself) or :class:`~outrelay.PermanentError` (not authorized,
no such stream: the runtime stops the subscription with that message).
``stop`` is idempotent and releases membership so that unacked messages move
promptly; ``ack`` after ``stop`` is ignored.

Acking without a coroutine: a backend whose ack is local bookkeeping (Kafka
commits offsets later, in bulk) may hand out an :class:`Inbound` subclass
whose :meth:`Inbound.ack_nowait` acks on the spot and returns True; the
runtime calls it first and awaits ``ack`` only when it returns False, as the
plain :class:`Inbound` always does. ``ack`` keeps working either way.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable

from outrelay.core.contract.reading import Received

__all__ = ["Inbound", "SubscriptionBackend", "SubscriptionSpec", "no_ack"]


@dataclasses.dataclass(frozen=True, slots=True)
class SubscriptionSpec:
    """What to consume and how.

    ``target`` is what the transport's ``target()`` renders for the events
    (topic, subject, stream key, ``exchange/routing-key``); a transport may
    accept a pattern (a NATS wildcard, a RabbitMQ binding key). ``group``
    names a consumer group (``None``: fan-out). ``member`` is this member's
    name, unique within the group (the runtime makes one per process).
    """

    target: str
    group: str | None = None
    member: str = "member"
    claim_timeout: float = 30.0
    prefetch: int = 256
    from_beginning: bool = False


async def no_ack() -> None:
    """The ``ack`` of a message that needs none (fan-out on most brokers)."""


@dataclasses.dataclass(slots=True)
class Inbound:
    """One message a backend hands to the runtime.

    ``received`` is the decoded message, or ``None`` with ``error`` set
    when it is not an outrelay CloudEvent. ``stream`` is its ordering key
    (``received.event.stream``; for an undecodable message whatever the
    broker knows, or ``""``). ``delivery_count`` is 1 on a first delivery
    and higher on a redelivery, when the broker says (else 1). ``ack``
    marks it handled for the group.

    A backend may subclass it (the runtime only reads these attributes and
    calls ``ack``/``ack_nowait``), e.g. to render ``broker_id`` only when
    read or to ack synchronously (:meth:`ack_nowait`).
    """

    received: Received | None
    stream: str
    ack: Callable[[], Awaitable[None]] = no_ack
    error: str | None = None
    delivery_count: int = 1
    #: the broker's own id of the message (entry id, sequence, offset), for logs
    broker_id: str = ""

    def ack_nowait(self) -> bool:
        """Ack now, synchronously, if this message's backend can: True when it did
        (then do not also await :attr:`ack`; a repeated ack is ignored as with
        ``ack``), False when the caller must ``await ack()`` — always, here.

        An override must have exactly the effect of ``ack`` (and raise what it
        would: :class:`~outrelay.TransportError`), without awaiting anything.
        """
        return False


class SubscriptionBackend(ABC):
    """Consumer side of a transport for subscriptions (see the module docstring)."""

    def __init__(self, spec: SubscriptionSpec) -> None:
        self.spec = spec

    @abstractmethod
    async def start(self) -> None:
        """Join the group (or attach for fan-out) and resolve the position.

        :raises RetryableError: broker unreachable. :raises PermanentError:
            not authorized, or the target cannot exist.
        """

    @abstractmethod
    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        """Up to ``max_messages`` messages, waiting at most ``timeout`` seconds.

        :raises RetryableError: connection lost (the next call reconnects).
        """

    @abstractmethod
    async def stop(self) -> None:
        """Leave the group / detach; unacked messages move to other members. Idempotent."""

    def __repr__(self) -> str:
        s = self.spec
        return f"<{type(self).__name__} target={s.target!r} group={s.group!r} member={s.member!r}>"
