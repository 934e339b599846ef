"""Subscriptions of the ``rabbitmq`` transport: consumer groups and fan-out on AMQP queues.

On the broker. A **group**'s position is durable classic queues named from
``outrelay.group.<group>.<exchange>`` (the exchange is in the name so that
one group on two exchanges has two positions), bound to the exchange with
the target's binding key. They exist from the first ``start`` on, keep what
is published while every member is down, and a later member resumes there.
(An exchange keeps nothing, so ``spec.from_beginning`` cannot reach back
before the queues existed; it is accepted and has no effect.) Nothing
deletes them: drop an abandoned group with ``rabbitmqctl delete_queue``. A
**fan-out** subscriber gets its own server-named exclusive auto-delete queue,
bound before ``start`` returns and gone with its connection. Messages are
consumed with manual acks (``ack`` is ``basic.ack`` on the delivering
channel) and ``basic.qos`` prefetch.

Group order across members (contract #2): a plain shared queue round-robins
a stream's consecutive messages to different members, so it is not used.

* ``group_shards = N > 1`` (default 16) — load sharing: a
  ``x-consistent-hash`` exchange (the ``rabbitmq_consistent_hash_exchange``
  plugin, hashing the ``cloudEvents_partitionkey`` header) spreads streams
  over N shard queues, each consumed *exclusively* by one member at a time;
  live members split the shards among themselves through the broker (a
  members queue's consumer count), see :mod:`._shards`. A shard changes
  hands only after its holder's handed-out messages were acked, or when the
  holder died. Prefetch per shard is ``ceil(prefetch / share)``.
* ``group_shards = 1`` — one queue with ``x-single-active-consumer``: the
  broker delivers to one member at a time, the others are hot standbys. No
  plugin needed, order trivially kept, no load sharing.

A member that stops or dies. ``stop`` closes the member's connection; a
crashed process's socket is closed by its kernel; a silent peer (network cut,
frozen process) is dropped by the broker after the heartbeat, set to
``spec.claim_timeout`` (at least 2 s). The broker then puts its unacked
messages back *at their place* in their queue (a quorum queue, ``queue_type =
"quorum"``, hands returned messages out again before newer ones), and the next member
(the next single active consumer, or whoever claims the shard at its next
balancing tick, at most ``min(1 s, claim_timeout / 3)`` later) receives them
before anything later of their streams. Redeliveries carry
``delivery_count = 2`` (AMQP only says "redelivered").

Fan-out: every subscriber sees, in order, every message routed to it from
``start`` on; while it is disconnected nothing is kept (a new queue is made
when it reconnects).

Target. ``spec.target`` is ``"exchange/binding-key"`` (``*``/``#`` wildcards on
a topic exchange); ``""`` derives it from the destination's config: the
``exchange`` (which must then be fixed, not a template) and ``routing_key``
with every word holding a placeholder turned into ``#`` (``"orders.{type}"`` ->
``"orders.#"``; a ``fanout`` exchange ignores the key). A direct or headers
exchange cannot match a pattern: a templated routing key there raises
:class:`~outrelay.PermanentError` naming the option and the fix.

Raises: ``start`` -> :class:`~outrelay.RetryableError` (broker unreachable),
:class:`~outrelay.PermanentError` (refused credentials or permissions, no such
exchange, the consistent-hash plugin missing, or a group queue/exchange
declared with other arguments — PRECONDITION_FAILED — each with how to fix
it). ``receive`` -> RetryableError when the connection or a channel was lost
or a queue deleted (buffered deliveries are dropped: the broker requeues
them); the next ``receive`` reconnects. A message that is not an outrelay
CloudEvent comes back as ``Inbound(received=None, error=...)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Iterator
from typing import NoReturn

import aiormq.abc
import aiormq.exceptions

from outrelay.kit import (
    EventError,
    Inbound,
    PermanentError,
    RetryableError,
    SubscriptionBackend,
    SubscriptionSpec,
    UsageError,
)
from outrelay.transports.rabbitmq._client import connect
from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._errors import VENDOR_ERRORS, classify, reply_text, scrub
from outrelay.transports.rabbitmq._lanes import LOST, Lane, Link
from outrelay.transports.rabbitmq._reader import decode
from outrelay.transports.rabbitmq._shards import Balancer, declare_shards, queue_arguments

__all__ = ["RabbitMQSubscription", "group_queue"]

log = logging.getLogger("outrelay.transports.rabbitmq")
MAX_PREFETCH = 65535  # basic.qos prefetch_count is a 16-bit field


def group_queue(group: str, exchange: str) -> str:
    """The name of group ``group``'s queue on ``exchange`` (with ``group_shards > 1``: of its hash
    exchange, and the prefix of its shard queues ``<name>.<i>`` and ``<name>.members``)."""
    return f"outrelay.group.{group}.{exchange}"


class RabbitMQSubscription(SubscriptionBackend):
    """See the module docstring; made by ``RabbitMQTransport.subscription(spec)``."""

    def __init__(
        self, cfg: RabbitMQConfig, spec: SubscriptionSpec, *, exchange: str, binding_key: str, destination: str
    ) -> None:
        super().__init__(spec)
        self.cfg = cfg
        self.exchange = exchange
        self.binding_key = binding_key
        self.destination = destination
        self.queue = group_queue(spec.group, exchange) if spec.group is not None else ""
        self.shards = cfg.group_shards if spec.group is not None else 1
        if len(self.queue.encode()) + 10 > 255:
            raise PermanentError(
                f"group {spec.group!r}: queue name {self.queue[:60]!r}... exceeds AMQP's 255 bytes: use a shorter "
                "group name",
                destination=destination,
            )
        self._prefetch = max(1, min(spec.prefetch, MAX_PREFETCH))
        self._secrets = cfg.secrets()
        self._link: Link | None = None
        self._balancer: Balancer | None = None
        self._state = "new"  # new | started | stopped

    # -- lifecycle -----------------------------------------------------------

    async def start(self) -> None:
        if self._state == "started" and self._link is not None and self._link.lost is None:
            return
        self._state = "started"
        await self._attach()

    async def stop(self) -> None:
        self._state = "stopped"
        await self._drop()

    async def _attach(self) -> None:
        """Connect, declare and bind, and consume (see the module docstring)."""
        await self._drop()
        heartbeat = max(2, round(self.spec.claim_timeout))
        conn = await connect(self.cfg, self.destination, name=f"outrelay subscriber {self.spec.member}",
                             heartbeat=heartbeat)  # fmt: skip
        try:
            with self._mapped():
                link = Link(conn, await conn.channel(publisher_confirms=False))
                if self.cfg.declare_exchange:
                    await link.control.declare_exchange(self.exchange, self.cfg.exchange_type, durable=True)
                if self.shards > 1:
                    await declare_shards(link.control, self.queue, self.exchange, self.binding_key, self.shards,
                                         self.cfg.queue_type)  # fmt: skip
                    balancer = Balancer(link, self.queue, self.shards, self.spec.member, self._prefetch,
                                        self.spec.claim_timeout)  # fmt: skip
                    await balancer.join()
                    self._balancer = balancer
                else:
                    if self.queue:
                        arguments = {"x-single-active-consumer": True, **queue_arguments(self.cfg.queue_type)}
                        queue = await link.control.declare_queue(self.queue, durable=True, arguments=arguments)
                    else:
                        queue = await link.control.declare_queue(exclusive=True, auto_delete=True)
                    await queue.bind(self.exchange, self.binding_key)
                    await link.consume(queue.name, self._prefetch)
        except BaseException:
            if self._balancer is not None:
                await self._balancer.close()
                self._balancer = None
            with contextlib.suppress(*VENDOR_ERRORS, RuntimeError):
                await conn.close()
            raise
        conn.close_callbacks.add(link.on_close)
        link.control.close_callbacks.add(link.on_close)
        self._link = link

    async def _drop(self) -> None:
        balancer, self._balancer = self._balancer, None
        if balancer is not None:
            await balancer.close()
        link, self._link = self._link, None
        if link is None:
            return
        link.lost = link.lost or "stopped"
        if not link.conn.is_closed:
            try:  # closing the connection is what makes the broker requeue our unacked messages
                await asyncio.wait_for(link.conn.close(), self.cfg.connect_timeout)
            except (*VENDOR_ERRORS, RuntimeError) as exc:
                log.debug("destination %s: close: %s", self.destination, classify(exc, self._secrets)[1])

    # -- consuming -----------------------------------------------------------

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        if self._state != "started":
            raise UsageError(f"{self!r}: receive() while {self._state}; call start() first")
        link = self._link
        if link is None:
            await self._attach()  # reconnect after a loss reported by the previous call
            link = self._link
            assert link is not None
        out: list[Inbound] = []
        for lane in list(link.lanes.values()):  # a release was abandoned: what it held back goes first
            while lane.held and not lane.draining and len(out) < max_messages:
                out.append(self._hand(lane, lane.held.pop(0)))
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(out) < max_messages:
            try:
                item = link.inbox.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if out or left <= 0:  # hand over what is there rather than wait to fill the batch
                    break
                try:
                    item = await asyncio.wait_for(link.inbox.get(), left)
                except TimeoutError:
                    break
            if item is LOST or link.lost is not None:
                await self._lose(link)  # raises
            assert item is not None
            lane, message = item
            if lane.closed:
                continue  # released or lost: the broker requeued it
            if lane.draining or lane.held:
                lane.held.append(message)  # being released to another member (or behind what was)
                continue
            out.append(self._hand(lane, message))
        return out

    async def _lose(self, link: Link) -> NoReturn:
        """Forget ``link`` (its deliveries are requeued by the broker) and report the loss."""
        if self._link is link:
            await self._drop()
        raise RetryableError(
            f"subscription to {self.exchange}/{self.binding_key} on {self.cfg.where}: the connection or channel "
            f"was lost ({link.lost}); unacked messages return to the queue, the next receive reconnects",
            destination=self.destination,
        )

    def _hand(self, lane: Lane, message: aiormq.abc.DeliveredMessage) -> Inbound:
        lane.outstanding += 1
        props = message.header.properties
        tag = message.delivery_tag
        ack = functools.partial(self._ack, lane, tag)
        count = 2 if message.redelivered else 1
        exchange, routing_key = message.exchange, message.routing_key
        try:
            received = decode(props.headers, message.body, props.content_type, exchange, routing_key)
        except (EventError, ValueError, TypeError) as exc:
            stream = (props.headers or {}).get("cloudEvents_partitionkey")
            why = f"not an outrelay CloudEvent ({exc}): message_id={props.message_id!r} from exchange {exchange!r} "
            why += f"with routing key {routing_key!r} on queue {lane.queue!r}"
            return Inbound(None, stream if isinstance(stream, str) else "", ack, why, count, f"{lane.queue}#{tag}")
        return Inbound(received, received.event.stream, ack, None, count, f"{lane.queue}#{tag}")

    async def _ack(self, lane: Lane, tag: int | None) -> None:
        # after a loss, a release or stop the broker has requeued the message: the same tag on a newer
        # channel would name another message
        if lane.closed or tag is None:
            return
        lane.outstanding -= 1
        if lane.outstanding == 0:
            lane.drained.set()
        try:
            await lane.wire.basic_ack(tag)
        except VENDOR_ERRORS as exc:
            log.debug("destination %s: ack lost: %s", self.destination, classify(exc, self._secrets)[1])

    # -- errors ----------------------------------------------------------------

    @contextlib.contextmanager
    def _mapped(self) -> Iterator[None]:
        """The subscriber's vendor-error boundary: :meth:`_refusal` for what a consumer can get wrong
        (PermanentError), else the transport's table (:func:`~._errors.classify`)."""
        where = f"subscription to {self.exchange}/{self.binding_key} on {self.cfg.where}"
        try:
            yield
        except VENDOR_ERRORS as exc:
            words = self._refusal(exc)
            if words is not None:
                raise PermanentError(f"{where}: {words}", destination=self.destination) from exc
            retryable, message = classify(exc, self._secrets)
            raise (RetryableError if retryable else PermanentError)(
                f"{where}: {message}", destination=self.destination
            ) from exc

    def _refusal(self, exc: BaseException) -> str | None:
        """How to fix a declare or consume the broker refused for this subscription's setup, or None."""
        reply = scrub(reply_text(exc), self._secrets)
        if isinstance(exc, aiormq.exceptions.ConnectionCommandInvalid) and "x-consistent-hash" in str(exc):
            return (
                f"group_shards = {self.shards} needs the broker's consistent-hash exchange: run "
                "`rabbitmq-plugins enable rabbitmq_consistent_hash_exchange`, or set group_shards = 1 "
                "(one single-active-consumer queue: order kept, no load sharing)"
            )
        if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
            return (
                f"a queue or exchange of group {self.spec.group!r} exists with other arguments ({reply}): delete "
                f"it (rabbitmqctl delete_queue NAME; for the exchange {self.queue!r} the management UI or API) or "
                "use another group name"
            )
        if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
            return f"exchange {self.exchange!r} does not exist: declare it, or set declare_exchange = true"
        if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
            queues = self.queue + "*" if self.queue else "amq.gen-* queues"
            return (
                f"access refused ({reply}): grant the user configure, write and read permission on {queues} "
                f"and read on {self.exchange!r}"
            )
        return None
