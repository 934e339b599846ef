"""The ``servicebus`` transport: Azure Service Bus through ``azure.servicebus.aio``.

Mapping (the CloudEvents AMQP binding, binary mode):

* data -> the message body (one Data section, bytes untouched);
* CloudEvents attributes -> ``application_properties`` ``cloudEvents_*``;
  ``datacontenttype`` -> ``content_type``;
* event id -> ``message_id`` (Service Bus duplicate detection keys on it);
* stream -> ``session_id`` when ``sessions`` (FIFO per stream), otherwise
  ``partition_key`` on a ``partitioned`` entity. Values over Service Bus's
  128 characters become a stable ``sha256-<hex>`` (see ``broker_id``).

Messages go out in ``ServiceBusMessageBatch``es sized by the entity (the
link's max message size): when a message does not fit, the batch is sent
and a new one started; a message that does not fit an empty batch is
Rejected. Batches of one ``send`` go out one after another, and a batch is
accepted or refused as a whole by the broker, so once a message fails no
later message with its key is sent (``ordered_batches``): they are reported
RetryLater.

Capabilities: ``ordering_by_key`` only with ``sessions`` (Service Bus
promises FIFO per session, nothing without); ``native_dedupe`` only with
``duplicate_detection`` (declared: AMQP cannot ask the entity).

Failure modes: ``server-busy`` -> RetryLater with ``busy_retry_after``;
connection/timeout/not-found/quota -> RetryLater (the sender is
re-created next time); too large -> Rejected; credentials refused or
without the Send claim -> Rejected with ``disable_destination`` (the
destination stops, its events stay pending until ``outrelay enable``; from
``open``/``check``, one PermanentError line); other non-retryable SDK
errors -> Rejected. Connection strings never appear in messages.

Sockets: every SDK sender is wrapped in a :class:`~._sockets.Guarded`, so the
AMQP connections it opened are closed when an open times out or is
cancelled, when a sender is dropped after a failure, and on ``close()``. The
SDK alone leaves some of them to the garbage collector (see ``_sockets``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from outrelay.kit import (
    Capabilities,
    ConfigError,
    Delivered,
    Event,
    Message,
    PermanentError,
    Reader,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    Template,
    Transport,
    TransportError,
    UsageError,
    binary_headers,
)
from outrelay.transports.servicebus._config import ServiceBusConfig, broker_id, make_client, mask
from outrelay.transports.servicebus._reader import ServiceBusReader
from outrelay.transports.servicebus._sockets import Guarded

__all__ = ["ServiceBusConfig", "ServiceBusTransport"]

PREFIX = "cloudEvents_"
_HELD = "an earlier message with this key failed"
#: AMQP conditions that say "this message will never be accepted".
_PERMANENT_CONDITIONS = ("amqp:not-allowed", "amqp:invalid-field", "amqp:decode-error", "amqp:precondition-failed")


def classify(exc: BaseException, cfg: ServiceBusConfig) -> SendResult:
    """Map one SDK failure to a per-message result (the one boundary)."""
    from azure.servicebus import exceptions as sbe

    if isinstance(exc, RetryableError):  # already ours (e.g. a sender that did not attach in time)
        return RetryLater(str(exc), exc.retry_after)
    text = mask(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, cfg)
    if isinstance(exc, sbe.ServiceBusServerBusyError):
        return RetryLater(f"Service Bus is busy: {text}", cfg.busy_retry_after)
    if isinstance(exc, sbe.MessageSizeExceededError):
        return Rejected(f"message too large for the entity: {text}")
    if isinstance(exc, sbe.MessagingEntityNotFoundError):
        return RetryLater(f"entity not found (create it or fix the queue/topic option): {text}")
    if isinstance(exc, sbe.ServiceBusAuthenticationError | sbe.ServiceBusAuthorizationError):
        # who is asking is refused, not the message: stop the destination (events stay pending), never retry for ever
        return Rejected(
            f"not allowed to send (needs the Send claim; fix the connection string, then `outrelay enable` the "
            f"destination): {text}",
            disable_destination=True,
        )
    if isinstance(exc, sbe.ServiceBusQuotaExceededError | sbe.MessagingEntityDisabledError):
        return RetryLater(f"entity cannot take messages now: {text}")
    if isinstance(exc, sbe.ServiceBusConnectionError | sbe.ServiceBusCommunicationError | sbe.OperationTimeoutError):
        return RetryLater(f"Service Bus unreachable: {text}")
    if isinstance(exc, TimeoutError):
        return RetryLater(f"send not confirmed within {cfg.send_timeout}s")
    if isinstance(exc, sbe.ServiceBusError):
        if any(c in text for c in _PERMANENT_CONDITIONS):
            return Rejected(f"Service Bus refused the message: {text}")
        # anything else (handler failures, unknown conditions) may pass: never dead-letter on a guess
        return RetryLater(f"{type(exc).__name__}: {text}")
    if isinstance(exc, ValueError | TypeError):
        return Rejected(f"invalid message: {text}")
    return RetryLater(f"unexpected {type(exc).__name__} from the Service Bus SDK")


@contextmanager
def map_errors(cfg: ServiceBusConfig, destination: str, what: str) -> Iterator[None]:
    """Turn SDK exceptions outside ``send`` into outrelay errors (secrets masked)."""
    try:
        yield
    except (TransportError, ConfigError):
        raise
    except Exception as exc:
        result = classify(exc, cfg)
        if isinstance(result, Rejected):
            raise PermanentError(f"{what}: {result.reason}", destination=destination) from None
        assert isinstance(result, RetryLater)
        err = RetryableError(f"{what}: {result.error}", destination=destination)
        raise err from None  # the SDK's exception text may quote the connection string


class ServiceBusTransport(Transport):
    """See the module docstring."""

    name = "servicebus"
    Config = ServiceBusConfig

    def __init__(self, config: ServiceBusConfig, *, destination: str = "servicebus") -> None:
        super().__init__(config, destination=destination)
        self.cfg: ServiceBusConfig = config
        where = f"destinations.{destination}.{'queue' if config.queue is not None else 'topic'}"
        self._template = Template(config.entity, where=where, segment="name", alphabet=r"A-Za-z0-9._\-")
        self._client: Any = None
        self._senders: dict[str, Guarded] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._state = "new"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=self.cfg.sessions,
            ordered_batches=True,
            native_dedupe=self.cfg.duplicate_detection,
            dedupe_window=self.cfg.dedupe_window if self.cfg.duplicate_detection else None,
            max_batch_count=1000,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
        )

    def target(self, event: Event) -> str:
        return self._template.render(event)

    def __repr__(self) -> str:
        return f"<ServiceBusTransport destination={self.destination!r} endpoint={self.cfg.endpoint!r}>"

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        if self._state == "open":
            return
        with map_errors(self.cfg, self.destination, f"cannot connect to {self.cfg.endpoint}"):
            self._client = make_client(self.cfg)
            self._state = "open"
            if self._template.is_static:
                try:
                    await self._sender(self._template.source)
                except BaseException:
                    await self.close()
                    self._state = "new"
                    raise

    async def _sender(self, entity: str) -> Any:
        """The open SDK sender of ``entity`` (opened on first use, bounded by open_timeout).

        A failed open leaves no socket behind (see ``_sockets``).

        :raises RetryableError: not attached within open_timeout, or the transport was closed meanwhile.
        :raises Exception: the SDK's error (callers classify it).
        """
        guarded = self._senders.get(entity)
        if guarded is None:
            client = self._client
            if client is None:
                raise self._closed_error()
            sdk = client.get_queue_sender(entity) if self.cfg.queue is not None else client.get_topic_sender(entity)
            guarded = Guarded(sdk)
            try:
                await guarded.open(self.cfg.open_timeout)
            except TimeoutError:
                raise RetryableError(
                    f"no sender attached to {entity!r} on {self.cfg.endpoint} within open_timeout="
                    f"{self.cfg.open_timeout}s; check that the endpoint is reachable and answers AMQP, "
                    "or raise open_timeout",
                    destination=self.destination,
                ) from None
            if self._client is not client:  # close() ran while this sender attached: it must not outlive it
                await guarded.close()
                raise self._closed_error()
            self._senders[entity] = guarded
        return guarded.sdk

    def _closed_error(self) -> RetryableError:
        return RetryableError(
            f"servicebus transport {self.destination!r} was closed during this call; open() it again",
            destination=self.destination,
        )

    async def _drop_sender(self, entity: str) -> None:
        guarded = self._senders.pop(entity, None)
        if guarded is not None:
            await guarded.close()

    async def close(self) -> None:
        """Close every sender and the client; every socket they opened is closed when this returns.

        Idempotent; raises nothing (closing confirms nothing more)."""
        senders, self._senders = list(self._senders.values()), {}
        client, self._client = self._client, None
        if self._state == "open":
            self._state = "closed"
        for guarded in senders:
            await guarded.close()
        if client is not None:
            await _quiet_close(client)

    async def check(self) -> str:
        entity = self.target(Event(type="check", stream="check"))
        await self.open()
        try:
            with map_errors(self.cfg, self.destination, f"cannot attach a sender to {entity!r}"):
                await self._sender(entity)
            kind = "queue" if self.cfg.queue is not None else "topic"
            return f"{kind} {entity!r} on {self.cfg.endpoint}: sender attached"
        finally:
            await self.close()

    def reader(self, target: str, **options: Any) -> Reader:
        return ServiceBusReader(self.cfg, target, **options)

    # -- sending -------------------------------------------------------------------------

    def _message(self, m: Message) -> Any:
        from azure.servicebus import ServiceBusMessage

        ev = m.event
        return ServiceBusMessage(
            ev.data,
            message_id=broker_id(ev.id),
            session_id=broker_id(m.key) if self.cfg.sessions else None,
            partition_key=broker_id(m.key) if self.cfg.partitioned and not self.cfg.sessions else None,
            content_type=ev.content_type,
            application_properties=binary_headers(ev, prefix=PREFIX),  # type: ignore[arg-type]
        )

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        if self._state != "open":
            raise UsageError(f"servicebus transport {self.destination!r} is {self._state}, not open")
        results: list[SendResult | None] = [None] * len(batch)
        failed: set[str] = set()
        # Consecutive messages to one entity (and, partitioned, one key) share batches.
        group: list[int] = []
        for i, m in enumerate(batch):
            if group and not self._same_group(batch[group[0]], m):
                await self._send_group(batch, group, results, failed)
                group = []
            group.append(i)
        if group:
            await self._send_group(batch, group, results, failed)
        return [r if r is not None else RetryLater("not sent") for r in results]

    def _same_group(self, a: Message, b: Message) -> bool:
        return a.target == b.target and (not self.cfg.partitioned or a.key == b.key)

    async def _send_group(
        self, batch: Sequence[Message], idx: list[int], results: list[SendResult | None], failed: set[str]
    ) -> None:
        entity = batch[idx[0]].target
        # One SDK sender is not safe for concurrent sends (the relay may have several
        # batches in flight): they take turns per entity.
        async with self._locks.setdefault(entity, asyncio.Lock()):
            await self._send_group_locked(entity, batch, idx, results, failed)

    async def _send_group_locked(
        self, entity: str, batch: Sequence[Message], idx: list[int], results: list[SendResult | None], failed: set[str]
    ) -> None:
        from azure.servicebus.exceptions import MessageSizeExceededError

        try:
            sender = await self._sender(entity)
        except Exception as exc:
            res = classify(exc, self.cfg)
            for i in idx:
                results[i] = res
                failed.add(batch[i].key)
            return
        current: Any = None
        members: list[int] = []
        limit = self.cfg.max_message_bytes
        for i in idx:
            m = batch[i]
            if m.key in failed:
                results[i] = RetryLater(_HELD)
                continue
            if len(m.event.data) > limit:
                results[i] = Rejected(f"message of {len(m.event.data)} bytes exceeds max_message_bytes={limit}")
                failed.add(m.key)
                continue
            try:
                msg = self._message(m)
            except Exception as exc:  # the SDK validates fields (lengths, types) here
                results[i] = classify(exc, self.cfg)
                failed.add(m.key)
                continue
            for _ in range(2):
                if current is None:
                    current, members = await sender.create_message_batch(), []
                try:
                    current.add_message(msg)
                    members.append(i)
                    break
                except MessageSizeExceededError:
                    if not members:  # does not fit an empty batch
                        results[i] = Rejected(f"message does not fit the entity's {current.max_size_in_bytes} bytes")
                        failed.add(m.key)
                        break
                    await self._flush(entity, sender, current, members, batch, results, failed)
                    current = None
                    if m.key in failed:
                        results[i] = RetryLater(_HELD)
                        break
        if current is not None and members:
            await self._flush(entity, sender, current, members, batch, results, failed)

    async def _flush(
        self,
        entity: str,
        sender: Any,
        sb_batch: Any,
        members: list[int],
        batch: Sequence[Message],
        results: list[SendResult | None],
        failed: set[str],
    ) -> None:
        try:
            await sender.send_messages(sb_batch, timeout=self.cfg.send_timeout)
            res: SendResult = Delivered()
        except Exception as exc:
            res = classify(exc, self.cfg)
            from azure.servicebus import exceptions as sbe

            if not isinstance(exc, sbe.ServiceBusServerBusyError | sbe.MessageSizeExceededError):
                await self._drop_sender(entity)  # reconnect on the next send
        for i in members:
            results[i] = res
            if not isinstance(res, Delivered):
                failed.add(batch[i].key)


async def _quiet_close(obj: Any) -> None:
    with contextlib.suppress(Exception):  # closing must not fail; nothing is confirmed after close
        await asyncio.wait_for(obj.close(), 5.0)
