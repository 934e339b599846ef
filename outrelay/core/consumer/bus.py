"""The event bus: subscribe handlers to what the relay publishes.

::

    bus = EventBus.from_config("outrelay.toml")      # [bus] destination, or $OUTRELAY_BUS; else in-process
    async with bus:
        await bus.subscribe(on_paid, types=["order.paid"], group="billing")   # one member of "billing" per event
        await bus.subscribe(refresh_cache)                                     # fan-out: every instance
        await bus.wait_closed()

A handler takes an :class:`~outrelay.Event` (``async def`` or a plain
function, which runs in a worker thread). The runtime, on top of a
transport's :class:`~outrelay.core.contract.subscription.SubscriptionBackend`:

* handles one stream's events in order, one at a time; different streams in
  parallel (at most ``concurrency`` at once), at most ``prefetch`` unacked;
* acks an event after its handler returned — a crash before that means the
  broker hands it to a live member again (at least once: make handlers
  idempotent, see :class:`~outrelay.core.consumer.inbox.Inbox`);
* retries a raising handler with backoff (``retry``, ``max_attempts``),
  then writes a consumer dead letter (:mod:`outrelay.core.consumer.consumer_dlq`) and
  either acks it and continues the stream (``on_exhausted="dead-letter"``)
  or holds the stream unacked until an operator replays or purges it
  (``"park"``); a message that is not an outrelay CloudEvent is
  dead-lettered at once with the reason;
* replays dead letters an operator queued (``outrelay dlq replay --consumer``).

Events that do not match the subscription's filters (types, tenants,
streams) are acked without calling the handler.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from outrelay.core.config.config import OutrelayConfig, RetryPolicy, load_config
from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetters
from outrelay.core.consumer.subscriber import Handler, Subscription, SubscriptionStats
from outrelay.core.contract.segments import RejectedTarget
from outrelay.core.contract.subscription import SubscriptionBackend, SubscriptionSpec
from outrelay.core.contract.transport import Delivered, Message, Transport
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError, PermanentError, UsageError

if TYPE_CHECKING:
    from outrelay.core.config.registry import Registry

__all__ = ["BUS_ENV", "EventBus", "Handler", "Subscription", "SubscriptionStats"]

log = logging.getLogger("outrelay.bus")

#: names the destination the bus consumes (``memory`` for the in-process bus); overrides ``[bus] destination``
BUS_ENV = "OUTRELAY_BUS"


def default_member() -> str:
    """This process's member name: host, pid and a random suffix (unique per run)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


class EventBus:
    """Subscriptions on one destination's transport (see the module docstring).

    ``dead_letters`` is where consumer dead letters go: a database url
    (``sqlite:///FILE``, ``postgresql://...``), ``"memory"`` (lost with the
    process; the default without a config) or a :class:`ConsumerDeadLetters`.
    """

    def __init__(
        self,
        transport: Transport,
        *,
        dead_letters: str | ConsumerDeadLetters = "memory",
        claim_timeout: float = 30.0,
        member: str | None = None,
    ) -> None:
        if not transport.capabilities.subscriptions:
            raise ConfigError(
                f"transport {transport.name!r} of destination {transport.destination!r} offers no subscriptions; "
                "choose a destination whose transport does (see `outrelay transports`)"
            )
        self.transport = transport
        self.claim_timeout = claim_timeout
        self.member = member or default_member()
        self._dlq_arg = dead_letters
        self._dlq: ConsumerDeadLetters | None = dead_letters if isinstance(dead_letters, ConsumerDeadLetters) else None
        self._subs: list[Subscription] = []
        self._opened = False
        self._closed = asyncio.Event()

    # -- construction -------------------------------------------------------

    @classmethod
    def memory(cls, broker: str = "bus", **kwargs: Any) -> EventBus:
        """The in-process bus on the memory broker ``broker`` (a memory destination with
        ``broker = "bus"`` publishes to it): same semantics as the broker backends."""
        # looked up by name: core never imports a transport (the registry knows the built-ins)
        from outrelay.core.config.registry import get_registry

        transport = get_registry().create_transport("memory", {"broker": broker}, destination=f"memory:{broker}")
        return cls(transport, **kwargs)

    @classmethod
    def from_config(
        cls,
        config: OutrelayConfig | str | Path | None = None,
        *,
        destination: str | None = None,
        member: str | None = None,
        dead_letters: str | None = None,
        registry: Registry | None = None,
    ) -> EventBus:
        """The bus a config selects: ``destination``, else ``$OUTRELAY_BUS``, else
        ``[bus] destination``, else the in-process bus (``memory``). Consumer dead
        letters go to ``dead_letters``, else ``[bus] dead_letters``, else the outbox database.

        Plugins see ``cfg`` through the ``outrelay_bus_configured`` hook: the
        tracing plugin turns tracing on for the process when ``[tracing]
        enabled = true`` (:mod:`outrelay.core.model.tracecontext`), the crypto plugin
        installs the ``[crypto]`` keys, so handlers get decrypted events.

        :raises ConfigError: unknown destination, a transport without subscriptions,
            or a missing extra — one line saying how to fix it.
        :raises MissingExtraError: tracing is enabled and OpenTelemetry is not installed.
        """
        cfg = config if isinstance(config, OutrelayConfig) else load_config(config, registry=registry)
        name = destination or os.environ.get(BUS_ENV) or cfg.bus.destination or "memory"
        dlq_url = dead_letters or cfg.bus.dead_letters or cfg.outbox.url
        kwargs: dict[str, Any] = {"dead_letters": dlq_url, "claim_timeout": cfg.bus.claim_timeout, "member": member}
        dest = cfg.destinations.get(name)
        if dest is None and name != "memory":
            known = ", ".join(sorted(cfg.destinations)) or "none"
            src = "--destination" if destination else f"${BUS_ENV}" if os.environ.get(BUS_ENV) else "[bus] destination"
            raise ConfigError(f"{src} names destination {name!r}, which is not defined (defined: {known}, or memory)")
        if registry is None:
            from outrelay.core.config.registry import get_registry

            registry = get_registry()
        registry.pm.hook.outrelay_bus_configured(config=cfg)
        if dest is None:
            return cls.memory(**kwargs)
        transport = registry.create_transport(dest.transport, dest.options, destination=name)
        return cls(transport, **kwargs)

    # -- subscribing --------------------------------------------------------

    async def subscribe(
        self,
        handler: Handler,
        *,
        types: Sequence[str] = ("*",),
        tenants: Sequence[str] = (),
        streams: Sequence[str] = (),
        group: str | None = None,
        name: str | None = None,
        target: str = "",
        max_attempts: int = 5,
        retry: RetryPolicy | None = None,
        on_exhausted: Literal["dead-letter", "park"] = "dead-letter",
        concurrency: int = 64,
        prefetch: int = 256,
        from_beginning: bool = False,
    ) -> Subscription:
        """Start handling events; returns once the position is resolved (an event
        published after this returns is never missed).

        ``group`` makes it a consumer group member (one member per event; the
        group's position is kept by the broker); without it every subscriber
        sees every event (fan-out). ``name`` names a fan-out subscription in
        dead letters (default: the handler's qualified name). ``target``: the
        topic/subject/key to consume (default: the destination's own).

        :raises ConfigError: invalid options. :raises RetryableError: broker
            unreachable. :raises PermanentError: not authorized / no such target.
        """
        if self._closed.is_set():
            raise UsageError("EventBus.subscribe() after close()")
        if max_attempts < 1 or concurrency < 1 or prefetch < 1:
            raise ConfigError("max_attempts, concurrency and prefetch must be at least 1")
        backend = self._backend(target, group, prefetch, from_beginning)
        consumer = group or name or getattr(handler, "__qualname__", None) or "subscriber"
        sub = Subscription(
            backend,
            handler,
            consumer=consumer,
            member=self.member,
            types=tuple(types),
            tenants=tuple(tenants),
            streams=tuple(streams),
            retry=retry or RetryPolicy(initial_delay=0.1, max_delay=5.0),
            max_attempts=max_attempts,
            park=on_exhausted == "park",
            concurrency=concurrency,
            prefetch=prefetch,
            dead_letters=await self._dead_letters(),
        )
        await sub.start()
        self._subs.append(sub)
        return sub

    def _backend(self, target: str, group: str | None, prefetch: int, from_beginning: bool) -> SubscriptionBackend:
        """The transport's subscription backend for one subscriber of this bus.

        :raises ConfigError: the transport has no subscriptions."""
        spec = SubscriptionSpec(
            target=target,
            group=group,
            member=self.member,
            claim_timeout=self.claim_timeout,
            prefetch=prefetch,
            from_beginning=from_beginning,
        )
        try:
            return self.transport.subscription(spec)
        except NotImplementedError as exc:
            raise ConfigError(str(exc)) from None

    async def _dead_letters(self) -> ConsumerDeadLetters:
        if self._dlq is None:
            url = self._dlq_arg if isinstance(self._dlq_arg, str) else "memory"
            self._dlq = await asyncio.to_thread(ConsumerDeadLetters, url)
        return self._dlq

    @property
    def dead_letters(self) -> ConsumerDeadLetters | None:
        """The consumer dead letters (None before the first subscription)."""
        return self._dlq

    @property
    def subscriptions(self) -> tuple[Subscription, ...]:
        return tuple(s for s in self._subs if not s.stopped)

    # -- publishing ---------------------------------------------------------

    async def publish(self, events: Event | Iterable[Event]) -> None:
        """Send events straight through the transport, **not** through an outbox:
        for tests and the in-process bus. Applications append to an
        :class:`~outrelay.Outbox` and let the relay publish (transactional).

        :raises TransportError: an event was not delivered.
        """
        batch = [events] if isinstance(events, Event) else list(events)
        if not self._opened:
            await self.transport.open()
            self._opened = True
        msgs = [Message(e, self.transport.target(e), e.stream) for e in batch]
        for m in msgs:
            if isinstance(m.target, RejectedTarget):
                raise PermanentError(f"event {m.event.id} was not published: {m.target.reason}")
        for m, r in zip(msgs, await self.transport.send(msgs), strict=True):
            if not isinstance(r, Delivered):
                where = self.transport.destination
                raise PermanentError(f"event {m.event.id} was not published: {r}", destination=where)

    # -- lifecycle ----------------------------------------------------------

    async def wait_closed(self) -> None:
        """Wait until :meth:`close` (e.g. from a signal handler)."""
        await self._closed.wait()

    async def close(self, grace: float = 10.0) -> None:
        """Unsubscribe everything (in-flight handlers get ``grace`` seconds), close the transport."""
        self._closed.set()
        subs, self._subs = self._subs, []
        await asyncio.gather(*(s.unsubscribe(grace=grace) for s in subs), return_exceptions=True)
        if self._opened:
            with contextlib.suppress(Exception):
                await self.transport.close()
            self._opened = False
        if self._dlq is not None and not isinstance(self._dlq_arg, ConsumerDeadLetters):
            self._dlq.close()
            self._dlq = None

    async def __aenter__(self) -> EventBus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return f"<EventBus destination={self.transport.destination!r} member={self.member!r}>"
