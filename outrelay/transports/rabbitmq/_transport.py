"""The ``rabbitmq`` transport: AMQP 0-9-1 with publisher confirms (aio-pika).

Each event is published to ``exchange`` (a Template) with ``routing_key``
(a Template) as one persistent message with ``message_id`` = event id,
``content_type``, ``type`` and ``timestamp`` properties and the CloudEvents
AMQP binding's ``cloudEvents_*`` headers. A message counts as delivered when
the broker confirms it. ``mandatory`` (default on) makes an unroutable
message a clear failure instead of a silent drop: ``unroutable =
"permanent"`` rejects it (dead letter), ``"retryable"`` retries it (for a
queue that is bound later).

Per-stream order with ``pipeline = true`` (default): a batch's messages are
published in batch order on one confirm channel — the broker routes a
channel's messages in the order received, so a stream's events reach their
queue in order without waiting for each confirm. A lost connection or a
closed channel loses a *tail* of what was sent, never a hole (aio-pika does
not re-send on reconnect). A message refused locally (too large, bad name)
or whose exchange is missing stops the later messages of its stream in the
batch (RetryLater, not sent). The case left is the broker refusing message
*k* and accepting *k+1* already on the wire — a nack from a queue at its
``x-max-length`` with ``x-overflow = reject-publish`` that had room again a
moment later, or a binding added between the two: both outcomes are
reported as they are and the break in order is logged as a warning.
``pipeline = false`` publishes a stream's next message only after the
previous one was confirmed (then nothing can overtake a refused message),
at one confirm round trip per message per stream; throughput then comes
from many streams per batch.

A missing exchange is found with a passive declare on a side channel (a
publish to it would close the publishing channel) and reported retryable,
with how to fix it. ``check`` also proves that the user may publish there,
with a probe published in an AMQP transaction and rolled back (nothing
reaches a queue; see :mod:`._check`). The publisher's connection is aio-pika's
robust one (:mod:`._client`): when it drops, the transport is
``reconnecting`` (:class:`~outrelay.kit.LifecycleTransport`: sends raise
RetryableError at once) until the client has reconnected and restored the
channel by itself; a closed channel (the connection still up) is reopened
by the client too, and sends meanwhile get RetryLater. RabbitMQ has no broker-side
dedupe: ``native_dedupe`` is false (consumers dedupe on ``message_id``).

Subscriptions (consumer groups on shard queues or a single-active-consumer
queue, fan-out on exclusive queues): :mod:`outrelay.transports.rabbitmq._subscriber`.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import aio_pika.abc
import aiormq.abc
import aiormq.exceptions

from outrelay.kit import (
    Capabilities,
    Delivered,
    Event,
    LifecycleTransport,
    Message,
    Reader,
    Rejected,
    RejectedTarget,
    RetryableError,
    RetryLater,
    SendResult,
    SubscriptionBackend,
    SubscriptionSpec,
    Template,
    binary_headers,
    send_ordered,
)
from outrelay.transports.rabbitmq._check import Check
from outrelay.transports.rabbitmq._client import connect, connect_robust
from outrelay.transports.rabbitmq._config import RabbitMQConfig, bad_names, split_target, subscription_target
from outrelay.transports.rabbitmq._errors import ERRORS, VENDOR_ERRORS, classify, mapped, result_for
from outrelay.transports.rabbitmq._publish import Staged
from outrelay.transports.rabbitmq._reader import RabbitMQReader
from outrelay.transports.rabbitmq._subscriber import RabbitMQSubscription
from outrelay.transports.rabbitmq._wire import HEADER_PREFIX, Properties

__all__ = ["HEADER_PREFIX", "RabbitMQConfig", "RabbitMQTransport"]

log = logging.getLogger("outrelay.transports.rabbitmq")


class RabbitMQTransport(LifecycleTransport[RabbitMQConfig]):
    """See the module docstring (open/close/reconnecting rules: :class:`~outrelay.kit.LifecycleTransport`)."""

    name = "rabbitmq"
    Config = RabbitMQConfig
    errors = ERRORS
    #: what the conformance suite cannot certify here, and why (see outrelay.conformance.ConformanceTarget)
    conformance_unsupported: ClassVar[Mapping[str, str]] = {
        "throttle": "RabbitMQ throttles by blocking the connection (flow control), with no retry hint",
        "from_beginning": "an exchange keeps nothing: a group's queues hold what arrived since its first start",
        "late_reader": (
            "an exchange keeps nothing: a message persists in the queues bound when it is sent, and the reader "
            "binds its own queue when it starts (with none bound, the transport refuses it as unroutable)"
        ),
    }
    #: a reader started after the send sees nothing of it (see ``conformance_unsupported["late_reader"]``)
    conformance_late_reader_options: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, config: RabbitMQConfig, *, destination: str = "rabbitmq") -> None:
        super().__init__(config, destination=destination)
        self._exchange_t = Template(
            config.exchange, where=f"destinations.{destination}.exchange", segment="name", alphabet=r"A-Za-z0-9._:\-"
        )
        self._key_t = Template(config.routing_key, where=f"destinations.{destination}.routing_key", segment="subject")
        self._secrets = config.secrets()
        self._conn: aio_pika.abc.AbstractRobustConnection | None = None
        self._channel: aio_pika.abc.AbstractChannel | None = None
        self._exchanges: dict[str, aio_pika.abc.AbstractExchange] = {}
        self._declare_lock = asyncio.Lock()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=True,
            native_dedupe=False,
            max_batch_count=1000,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
            subscriptions=True,
        )

    def target(self, event: Event) -> str:
        exchange, key = self._exchange_t.render(event), self._key_t.render(event)
        for part in (exchange, key):
            if isinstance(part, RejectedTarget):  # keep the marker: the relay rejects the message
                return part
        return f"{exchange}/{key}"

    # -- lifecycle -----------------------------------------------------------

    async def _open(self) -> None:
        """Connect (robust) and open a confirm channel. :raises RetryableError: broker unreachable."""
        self._exchanges.clear()
        self._conn = await connect_robust(
            self.cfg, self.destination, on_lost=self.connection_lost, on_restored=self._restored
        )
        with mapped("cannot open a channel", self.destination, self._secrets):
            self._channel = await self._conn.channel(publisher_confirms=True, on_return_raises=True)

    def _restored(self) -> None:
        self._exchanges.clear()  # a restarted broker may have lost what was checked before
        self.connection_restored()

    async def _close(self) -> None:
        conn, self._conn, self._channel = self._conn, None, None
        self._exchanges.clear()
        if conn is not None and not conn.is_closed:
            try:
                await asyncio.wait_for(conn.close(), self.cfg.connect_timeout)
            except (*VENDOR_ERRORS, RuntimeError) as exc:
                log.debug("destination %s: close: %s", self.destination, classify(exc, self._secrets)[1])

    # -- publishing ----------------------------------------------------------

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        channel = self._channel
        assert channel is not None  # open
        try:
            # the robust channel waits for its connection: one lost after send() checked the state is restored
            # in the background, and this send gives up (nothing started) after connect_timeout
            wire = await asyncio.wait_for(channel.get_underlay_channel(), self.cfg.connect_timeout)
        except TimeoutError as exc:
            raise RetryableError(
                f"{self.cfg.where}: the connection was lost and is not back within connect_timeout = "
                f"{self.cfg.connect_timeout:g} s; the client is reconnecting",
                destination=self.destination,
            ) from exc
        except VENDOR_ERRORS as exc:
            return [result_for(exc, self._secrets, m.target) for m in batch]
        # messages are staged (encoded, with a confirm future each) and written together: one write per
        # batch (or per round of send_chained) instead of aiormq's basic_publish per message (see _publish.py)
        staged = Staged(wire, mandatory=self.cfg.mandatory)

        async def start(m: Message) -> asyncio.Future[Any] | SendResult:
            prepared = self._prepare(m)
            if isinstance(prepared, Rejected):
                return prepared
            properties, name, routing_key = prepared
            try:
                await self._exchange(channel, name)  # exists (checked once per channel)
            except VENDOR_ERRORS as exc:
                return result_for(exc, self._secrets, m.target)
            try:
                return staged.stage(m.event.data, properties, name, routing_key)
            except (TypeError, ValueError, struct.error) as exc:  # pamqp refused a property value
                return Rejected(f"cannot encode the AMQP properties: {exc}")

        # chained: one message in flight per stream, so a later one never overtakes a lost or refused
        # one; pipelined: every message in batch order on one channel (the broker routes a channel's
        # messages in the order received), then all confirms together (see the module docstring)
        return await send_ordered(
            batch,
            start,
            self._confirm_outcome,
            pipeline=self.cfg.pipeline,
            timeout=self.cfg.confirm_timeout,
            destination=self.destination,
            log=log,
            flush=staged.write,
        )

    def _confirm_outcome(self, m: Message, confirm: asyncio.Future[Any]) -> SendResult:
        if confirm.cancelled():  # not written, or no confirm within confirm_timeout
            return result_for(TimeoutError(), self._secrets, m.target)
        return self._outcome(m, confirm.exception())

    def _prepare(self, m: Message) -> tuple[Properties, str, str] | Rejected:
        """The AMQP properties, exchange and routing key of ``m``, or why it cannot be published.

        Built as pamqp properties directly — what ``aio_pika.Message(...).properties`` gives
        (same values, ``priority`` 0 included) at a quarter of the CPU.
        """
        event = m.event
        if len(event.data) > self.cfg.max_message_bytes:
            return Rejected(
                f"message of {len(event.data)} bytes exceeds max_message_bytes={self.cfg.max_message_bytes}"
            )
        name, routing_key = split_target(m.target)
        invalid = bad_names(name, routing_key)
        if invalid is not None:
            return Rejected(invalid)
        properties = Properties(
            headers=binary_headers(event, prefix=HEADER_PREFIX),  # type: ignore[arg-type]
            content_type=event.content_type,
            delivery_mode=2 if self.cfg.persistent else 1,
            priority=0,
            message_id=event.id,
            timestamp=event.time,
            message_type=event.type,
            correlation_id=event.correlation_id,
        )
        return properties, name, routing_key

    def _outcome(self, m: Message, exc: BaseException | None) -> SendResult:
        if exc is None:
            return Delivered()
        if isinstance(exc, aiormq.exceptions.PublishError):
            name, routing_key = split_target(m.target)
            text = f"unroutable: no queue is bound to exchange {name!r} for routing key {routing_key!r}"
            return RetryLater(text) if self.cfg.unroutable == "retryable" else Rejected(text)
        if isinstance(exc, VENDOR_ERRORS):
            return result_for(exc, self._secrets, m.target)
        log.error("destination %s: publish raised %s (an aio-pika surprise)", self.destination, type(exc).__name__)
        return RetryLater(f"unexpected {type(exc).__name__} while publishing")

    async def _exchange(self, channel: aio_pika.abc.AbstractChannel, name: str) -> aio_pika.abc.AbstractExchange:
        """The exchange ``name``, checked to exist once per channel (passively, on a side channel)."""
        # a lane still running on a channel that was replaced must not fill the new channel's cache
        cache = self._exchanges if channel is self._channel else {}
        found = cache.get(name)
        if found is not None:
            return found
        async with self._declare_lock:
            found = cache.get(name)
            if found is None:
                if not name:
                    found = channel.default_exchange
                elif self.cfg.declare_exchange:
                    found = await channel.declare_exchange(name, self.cfg.exchange_type, durable=True)
                else:
                    await self._passive_declare(await channel.get_underlay_channel(), name)
                    found = await channel.get_exchange(name, ensure=False)
                cache[name] = found
        return found

    async def _passive_declare(self, wire: aiormq.abc.AbstractChannel, name: str) -> None:
        """:raises ChannelNotFoundEntity: no such exchange. Checked on a plain aiormq side channel of
        the same connection: the 404 closes only that one (a robust channel would be reopened)."""
        side = await wire.connection.channel(publisher_confirms=False)
        try:
            await side.exchange_declare(name, passive=True, timeout=self.cfg.confirm_timeout)
        finally:
            if not side.is_closed:
                await side.close()

    # -- probes --------------------------------------------------------------

    async def _check(self) -> str:
        """Reachability, credentials/vhost, that the exchange (or default-exchange queue) exists, and
        that the user may publish to it, proved without delivering anything, on a connection of its
        own: see :mod:`._check` (:meth:`check`, the kit's, opens the transport first).

        :raises RetryableError: unreachable, or a step got no answer within ``connect_timeout``.
        :raises PermanentError: credentials or vhost refused; the user may not publish to the exchange
            (the line names user, vhost, exchange and the ``rabbitmqctl`` fix); the exchange is internal;
            or it is missing and ``declare_exchange`` is off.
        """
        name, routing_key = split_target(self.check_target("outrelay.check"))
        conn = await connect(self.cfg, self.destination, name="outrelay check")
        check = Check(self.cfg, self.destination, self._secrets, templated_key=not self._key_t.is_static)
        return await check.run(conn, name, routing_key)

    def reader(self, target: str, **options: Any) -> Reader:
        return RabbitMQReader(self.cfg, target, destination=self.destination, **options)

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A consumer group or fan-out subscriber (see :mod:`outrelay.transports.rabbitmq._subscriber`).

        :raises PermanentError: the target cannot be consumed (a templated exchange, a pattern on a
            direct/headers exchange, the default exchange); the message names the option and the fix.
        """
        exchange, binding_key = subscription_target(self.cfg, spec.target, self.destination)
        return RabbitMQSubscription(
            self.cfg, spec, exchange=exchange, binding_key=binding_key, destination=self.destination
        )
