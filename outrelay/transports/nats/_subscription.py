"""Subscriptions of the ``nats`` transport: JetStream consumers for groups and fan-out.

``transport.subscription(spec)`` consumes ``spec.target``, a subject or a
wildcard; ``""`` derives it from the ``subject`` template, each placeholder
token becoming ``*`` (``>`` when it is the last token: ``events.{category}.{stream}``
-> ``events.*.>``). A placeholder inside a token (``ev-{type}``) cannot be a
NATS pattern: :class:`~outrelay.PermanentError` naming ``subject``. The stream
is ``expected_stream``, else ``create_stream`` (created if missing), else the
stream whose subjects cover the target.

**Fan-out** (:class:`NatsFanout`): one ephemeral pull consumer per
subscriber, deliver policy ``new`` (``all`` with ``from_beginning``), no
acks, created before ``start`` returns, so everything stored afterwards is
seen, in stream order. Like nats-py's ordered consumer it checks the
consumer sequence of every delivery; after a gap (a delivery lost with a
connection) or when the server dropped the consumer (inactive longer than
``max(60, 2 * claim_timeout)`` s) it re-creates it from the last stream
sequence seen, so nothing in between is missed. Nothing stays on the server
after ``stop``.

**Groups** (:class:`~outrelay.transports.nats._group.NatsGroup`): nats-server
2.9 has no pinned consumers and no partitioned consumers, and one shared
pull consumer hands consecutive messages of a stream to different members.
So a group is split into ``group_shards`` shards (default 1), each a durable
pull consumer on the target; a message belongs to shard
``crc32(stream) % group_shards``. One member at a time holds a shard, by a
lease in a JetStream KV bucket; it reads the whole target through the
shard's consumer, hands on the shard's messages and acks the others at once.
Hence a stream's messages only ever reach the shard's holder, in stream
order, and the server keeps the position. See that module for failover; in
short: a member that stops or loses a shard to rebalancing naks what it had
not finished (redelivered first, in order) and releases the lease; a member
that died loses its leases after ``claim_timeout`` and the next holder
re-creates the shard's consumer from its ack floor, so the dead member's
unacked messages come back first, in order (some acked ones above the floor
come back too: duplicates, never gaps). Each member reads every message once
per shard it holds: the price of order without server support.

Messages that are not outrelay CloudEvents come back as
``Inbound(received=None, error=...)``. ``start`` raises
:class:`~outrelay.RetryableError` (server unreachable) or
:class:`~outrelay.PermanentError` (no stream, not authorized, bad target);
``receive`` raises RetryableError while the connection is down and
reconnects by itself on the next call.
"""

from __future__ import annotations

import contextlib
import re
import zlib
from collections.abc import Awaitable, Callable

import nats.errors
import nats.js.api
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.client import JetStreamContext

from outrelay.kit import (
    Inbound,
    PermanentError,
    RetryableError,
    SubscriptionBackend,
    SubscriptionSpec,
    TransportError,
    UsageError,
    no_ack,
)
from outrelay.transports.nats._client import connect, ensure_stream
from outrelay.transports.nats._config import NatsConfig, derive_target
from outrelay.transports.nats._errors import ERRORS, mapped
from outrelay.transports.nats._wire import decode

__all__ = ["NatsBackend", "NatsFanout", "derive_target", "fetch_ready", "inbound", "stream_of"]

#: how long the "what is waiting now" probe may take before we block for the next message instead
_PROBE = 0.01


async def fetch_ready(sub: JetStreamContext.PullSubscription, batch: int, wait: float) -> list[Msg]:
    """What the consumer has for us now (up to ``batch``), else the next message within ``wait``.

    nats-py's ``fetch(batch, timeout)`` first takes what is waiting (a ``no_wait`` pull), but when
    nothing is, it holds a pull open until ``batch`` messages came or ``timeout`` passed — an event
    trickling in would wait up to ``timeout``. So: a short fetch for what is waiting, then a pull of one.

    :raises TimeoutError: nothing came within ``wait``.
    """
    try:
        return await sub.fetch(batch=batch, timeout=min(_PROBE, wait))
    except TimeoutError:
        pass
    return await sub.fetch(batch=1, timeout=wait)


def stream_of(msg: Msg) -> str:
    """The ordering key of a message from its headers (``""`` when it has none)."""
    headers = msg.headers or {}
    return headers.get("ce-streamid") or headers.get("ce-partitionkey") or ""


def inbound(msg: Msg, ack: Callable[[], Awaitable[None]]) -> Inbound:
    """An :class:`Inbound` for ``msg``; a message that does not decode carries ``error`` instead."""
    meta = msg.metadata
    broker_id = f"{meta.stream}:{meta.sequence.stream}"
    try:
        received = decode(msg)
    except Exception as exc:  # whatever a foreign message makes the decoder raise
        return Inbound(
            None,
            stream_of(msg),
            ack,
            error=f"not an outrelay CloudEvent on subject {msg.subject!r} ({broker_id}): {exc}",
            delivery_count=meta.num_delivered,
            broker_id=broker_id,
        )
    return Inbound(received, received.event.stream, ack, delivery_count=meta.num_delivered, broker_id=broker_id)


def sanitize(name: str) -> str:
    """``name`` as a consumer/bucket name fragment, with a checksum so that distinct names stay distinct."""
    return f"{re.sub(r'[^A-Za-z0-9_-]', '_', name)[:32]}_{zlib.crc32(name.encode()):08x}"


class NatsBackend(SubscriptionBackend):
    """Connection, stream lookup and reconnect shared by the fan-out and group backends."""

    def __init__(self, cfg: NatsConfig, destination: str, spec: SubscriptionSpec) -> None:
        super().__init__(spec)
        self.cfg = cfg
        self.destination = destination
        self.target = spec.target or derive_target(self.cfg.subject, destination=self.destination)
        self.stream = ""
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._state = "new"  # new | started | stopped

    def _error(self, what: str, exc: BaseException) -> TransportError:
        return ERRORS.error(exc, f"subscription to {self.target!r}: {what}", destination=self.destination)

    async def _connect(self) -> JetStreamContext:
        """Connect and find the stream. :raises RetryableError/PermanentError:"""
        nc = await connect(self.cfg, self.destination)
        js = nc.jetstream(timeout=self.cfg.ack_timeout)
        try:
            if self.cfg.create_stream is not None:
                await ensure_stream(js, self.cfg.create_stream, self.destination)
            if not self.stream:
                self.stream = await self._find_stream(js)
        except BaseException:
            await nc.close()
            raise
        self._nc, self._js = nc, js
        return js

    async def _start(self, setup: Callable[[], Awaitable[None]]) -> None:
        """Connect, then ``setup()`` the consumers (the connection is closed again if that fails).

        :raises RetryableError/PermanentError: from connecting or from ``setup``."""
        await self._connect()
        try:
            await setup()
        except BaseException:
            await self._close_connection()
            raise
        self._state = "started"

    async def _find_stream(self, js: JetStreamContext) -> str:
        name = self.cfg.expected_stream or (self.cfg.create_stream.name if self.cfg.create_stream else None)
        if name:
            return name
        try:
            return await js.find_stream_name_by_subject(self.target)
        except nats.js.errors.NotFoundError as exc:
            raise PermanentError(
                f"no JetStream stream covers {self.target!r} on {self.cfg.where}: create one, or set "
                "expected_stream (or create_stream)",
                destination=self.destination,
            ) from exc
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            raise self._error("stream lookup", exc) from exc

    async def _ready(self) -> None:
        """Raise RetryableError while nats-py reconnects; start over when it gave up."""
        if self._state != "started":
            raise UsageError(f"{self!r}.receive() while {self._state}")
        nc = self._nc
        if nc is None or nc.is_closed:
            await self._reattach()
        elif not nc.is_connected:
            raise RetryableError(
                f"subscription to {self.target!r}: connection to {self.cfg.where} lost, reconnecting",
                destination=self.destination,
            )

    async def _reattach(self) -> None:
        """Connect again after the client gave up (subclasses re-create their consumers)."""
        await self._close_connection()
        await self._connect()

    async def _close_connection(self) -> None:
        nc, self._nc, self._js = self._nc, None, None
        if nc is not None and not nc.is_closed:
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                await nc.close()


class NatsFanout(NatsBackend):
    """Fan-out: an ephemeral pull consumer per subscriber (see the module docstring)."""

    def __init__(self, cfg: NatsConfig, destination: str, spec: SubscriptionSpec) -> None:
        super().__init__(cfg, destination, spec)
        self._sub: JetStreamContext.PullSubscription | None = None
        self._consumer = ""
        self._last_seq: int | None = None  # stream sequence of the last message handed on
        self._next_dseq = 1

    async def start(self) -> None:
        if self._state != "new":
            raise UsageError(f"{self!r} was already started")
        await self._start(self._attach)

    async def _attach(self) -> None:
        """Create the consumer: new messages, or those after ``_last_seq`` when re-attaching."""
        js = self._js
        assert js is not None
        api = nats.js.api
        if self._last_seq is not None:
            policy, start = api.DeliverPolicy.BY_START_SEQUENCE, self._last_seq + 1
        else:
            policy, start = (api.DeliverPolicy.ALL if self.spec.from_beginning else api.DeliverPolicy.NEW), None
        config = api.ConsumerConfig(
            deliver_policy=policy,
            opt_start_seq=start,
            ack_policy=api.AckPolicy.NONE,
            filter_subject=self.target,
            inactive_threshold=max(60.0, 2 * self.spec.claim_timeout),
            max_waiting=16,
        )
        with mapped(f"cannot create a consumer on stream {self.stream!r} for {self.target!r}", self.destination):
            info = await js.add_consumer(self.stream, config)
            self._sub = await js.pull_subscribe_bind(consumer=info.name, stream=self.stream)
        self._consumer, self._next_dseq = info.name, 1

    async def _reattach(self) -> None:
        await super()._reattach()
        await self._attach()

    async def _replace_consumer(self) -> None:
        """Drop the consumer (a delivery was lost, or the server forgot it) and resume after ``_last_seq``."""
        sub, self._sub = self._sub, None
        js = self._js
        if sub is not None:
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                await sub.unsubscribe()
        if js is not None and self._consumer:
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                await js.delete_consumer(self.stream, self._consumer)
        await self._attach()

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        await self._ready()
        if self._sub is None:
            await self._replace_consumer()
        assert self._sub is not None
        try:
            msgs = await fetch_ready(self._sub, max(1, min(max_messages, 1000)), max(0.01, timeout))
        except TimeoutError:  # nats-py raises its own and the builtin one; neither means an error
            return []
        except (nats.js.errors.NotFoundError, nats.errors.NoRespondersError, nats.js.errors.ServiceUnavailableError):
            await self._replace_consumer()  # the server dropped our consumer: resume where we were
            return []
        except (nats.errors.Error, OSError) as exc:
            raise self._error("fetch", exc) from exc
        out: list[Inbound] = []
        for msg in msgs:
            meta = msg.metadata
            if meta.sequence.consumer != self._next_dseq:
                await self._replace_consumer()
                break
            self._next_dseq += 1
            self._last_seq = meta.sequence.stream
            out.append(inbound(msg, no_ack))
        return out

    async def stop(self) -> None:
        if self._state == "stopped":
            return
        self._state = "stopped"
        sub, self._sub = self._sub, None
        if sub is not None and self._nc is not None and self._nc.is_connected:
            with contextlib.suppress(TimeoutError, nats.errors.Error, OSError):
                await sub.unsubscribe()
                if self._js is not None:
                    await self._js.delete_consumer(self.stream, self._consumer)
        await self._close_connection()
