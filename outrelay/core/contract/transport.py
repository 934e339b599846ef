"""The transport contract: everything a transport author implements.

A transport is a class with a frozen config model, declared capabilities and
four coroutines (``outrelay.kit.LifecycleTransport`` carries the open/close
rules, so a plugin writes only ``_open``/``_send``/``_close``)::

    class MyTransport(Transport):
        name = "mine"
        Config = MyConfig                      # a TransportConfig subclass
        async def open(self) -> None: ...
        async def send(self, batch) -> list[SendResult]: ...
        async def close(self) -> None: ...
        async def check(self) -> str: ...
        def target(self, event) -> str: ...    # topic/subject/queue for event

Guarantees a transport gives the relay:

* ``send`` returns one :class:`SendResult` per message, in order:
  :class:`Delivered`, :class:`RetryLater` (:class:`NotSent` when it was not
  attempted) or :class:`Rejected`. Vendor exceptions never escape; a failure
  of the whole batch may be raised as RetryableError/PermanentError.
* **Progress survives a cut.** Each outcome is reported to the send's
  :class:`~outrelay.core.contract.progress.Progress` as soon as the broker confirms
  it (the kit's ordering helpers do it). When ``attempt_timeout``, shutdown
  or a lost connection cuts the batch, what was reported settles as
  delivered and only the unconfirmed tail is retried. The transport starts
  no message that ``progress.may_start`` refuses (deadline near, relay
  stopping) and reports it :class:`NotSent`.
* Order per key: with ``capabilities.ordered_batches`` a batch may hold
  several messages of one key; they are delivered in batch order, and after
  one fails none of the later ones is (they are reported NotSent/RetryLater).
  Otherwise the relay never puts two messages of one key in a batch.
* ``open`` may fail with RetryableError (broker down) or PermanentError (fix
  the config). ``close`` is idempotent; ``send`` after ``close`` raises
  UsageError. ``check`` probes connectivity *and publish permission* and
  returns a short line, or raises a TransportError saying what to fix.
* Inside the process: never block the event loop, leave no task or socket
  behind after ``close`` (or a failed ``open``/``check``), let
  ``CancelledError`` through, share no mutable state between instances, and
  never change the batch (list or messages) it was given.

``reader()`` returns a :class:`~outrelay.core.contract.reading.Reader` when
``capabilities.reader``; ``subscription()`` a subscription backend when
``capabilities.subscriptions`` (:mod:`outrelay.core.contract.subscription`).
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from outrelay.core.contract.reading import Reader, Received
from outrelay.core.contract.subscription import SubscriptionBackend, SubscriptionSpec
from outrelay.core.model.envelope import Event

__all__ = [
    "Capabilities",
    "Delivered",
    "Detail",
    "Message",
    "NotSent",
    "Reader",
    "Received",
    "Rejected",
    "RetryLater",
    "SendResult",
    "Transport",
    "TransportConfig",
]


#: a send result's ``detail``: a short string, a small mapping of JSON values, or None
Detail = str | Mapping[str, Any] | None


class TransportConfig(BaseModel):
    """Base of every transport's config model: frozen, unknown keys rejected.

    Declare secrets as :class:`pydantic.SecretStr` so they never print.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """What a transport can do; the relay and the conformance suite obey it.

    ``max_message_bytes`` bounds the encoded size of one message (the
    conformance suite sends exactly that many payload bytes, then one more,
    which must be :class:`Rejected`). ``dedupe_window`` is in seconds, or
    ``None`` when ``native_dedupe`` holds for ever (or does not apply).
    """

    ordering_by_key: bool = True
    ordered_batches: bool = False
    native_dedupe: bool = False
    dedupe_window: float | None = None
    max_batch_count: int = 100
    max_batch_bytes: int | None = None
    max_message_bytes: int | None = None
    max_header_bytes: int | None = None
    cloudevents_modes: tuple[str, ...] = ("structured",)
    reader: bool = False
    #: the transport offers subscriptions (consumer groups and fan-out) through
    #: :meth:`Transport.subscription` (see :mod:`outrelay.core.contract.subscription`)
    subscriptions: bool = False
    #: ``"at_least_once"``: Delivered means stored, a consumer attaching later still gets it; ``"at_most_once"``:
    #: only consumers attached at send time get it, nothing is kept (Redis Pub/Sub, MQTT without sessions)
    delivery: str = "at_least_once"


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """One event on its way to one destination.

    ``target`` is the rendered topic/subject/queue/URL path for this event;
    ``key`` the ordering key (the event's stream); ``attempt`` counts from 1.
    """

    event: Event
    target: str
    key: str
    attempt: int = 1


class SendResult:
    """Base of the three per-message outcomes.

    Each may carry a ``detail``: what the transport learnt about this attempt,
    for the delivery-attempt log (``outrelay attempts``) — a short string or a
    small mapping of JSON values (webhook: ``{"status": 500, "body": "..."}``
    with a bounded excerpt; a broker: its error code). Optional (default
    None), never part of equality, never a secret; the relay bounds what it
    keeps (see :mod:`outrelay.core.relay.attempts`).
    """

    __slots__ = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Delivered(SendResult):
    """The broker confirmed the message (``duplicate``: it already had it)."""

    duplicate: bool = False
    detail: Detail = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class RetryLater(SendResult):
    """A transient failure; ``retry_after`` is the broker's hint in seconds."""

    error: str
    retry_after: float | None = None
    detail: Detail = dataclasses.field(default=None, compare=False)


@dataclasses.dataclass(frozen=True, slots=True)
class NotSent(RetryLater):
    """The message was not attempted: an earlier one of its key failed, the
    send's deadline was too near to start it, or the relay is stopping.

    The relay leaves it pending as it was — no attempt counted, no backoff —
    and it goes out with the next claim of its stream.
    """


@dataclasses.dataclass(frozen=True, slots=True)
class Rejected(SendResult):
    """A permanent failure. ``disable_destination``: stop the whole
    destination until an operator re-enables it (e.g. webhook 410 Gone);
    the message then stays pending instead of being dead-lettered."""

    reason: str
    disable_destination: bool = False
    detail: Detail = dataclasses.field(default=None, compare=False)


class Transport(ABC):
    """Base class of every transport (see the module docstring)."""

    name: ClassVar[str]
    Config: ClassVar[type[TransportConfig]] = TransportConfig
    #: for ``outrelay conformance``: the config option holding the target
    #: (None: guessed from target/topic/subject/queue/... names)
    conformance_target_option: ClassVar[str | None] = None
    #: for ``outrelay conformance``: options that make the transport unreachable
    #: (None: the broker-down checks skip with a reason)
    conformance_unreachable_options: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, config: TransportConfig, *, destination: str = "default") -> None:
        self.config = config
        self.destination = destination

    @property
    def capabilities(self) -> Capabilities:
        """Declared capabilities; may depend on the config."""
        return Capabilities()

    @abstractmethod
    async def open(self) -> None:
        """Connect. :raises RetryableError: when the broker is unreachable."""

    @abstractmethod
    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        """Publish ``batch``; one result per message, in order."""

    @abstractmethod
    async def close(self) -> None:
        """Flush and disconnect; idempotent."""

    def target(self, event: Event) -> str:
        """The topic/subject/queue/path ``event`` goes to (usually a rendered
        :class:`~outrelay.core.contract.templates.Template`); must not fail."""
        return ""

    async def check(self) -> str:
        """Probe connectivity and publish permission; return a short summary."""
        await self.open()
        try:
            return "reachable"
        finally:
            await self.close()

    def reader(self, target: str, **options: Any) -> Reader:
        """A :class:`Reader` for ``target``. :raises NotImplementedError: if none."""
        raise NotImplementedError(f"transport {self.name!r} provides no reader")

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A :class:`~outrelay.core.contract.subscription.SubscriptionBackend` consuming
        ``spec.target`` (``capabilities.subscriptions``).

        :raises NotImplementedError: the transport offers no subscriptions.
        """
        raise NotImplementedError(f"transport {self.name!r} offers no subscriptions")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} destination={self.destination!r}>"
