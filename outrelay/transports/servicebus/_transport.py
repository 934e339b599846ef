"""The ``servicebus`` transport: Azure Service Bus through ``azure.servicebus.aio``.

Mapping: the CloudEvents AMQP binding, binary mode (see ``_wire``).

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

Progress: each Service Bus batch's outcome is reported as soon as the broker
answers it (:func:`~outrelay.kit.current_progress`); a later batch is started
only if the previous batch's latency still fits before the send's deadline
(``may_start``), otherwise its messages are reported not sent (deferred), so
a cut send keeps every batch that was confirmed.

Failure modes: one table, ``_errors.ERRORS`` (server-busy -> RetryLater with
``busy_retry_after``; credentials refused -> Rejected with
``disable_destination``; connection strings never appear in messages). A
sender that failed is dropped and re-created on the next send.

Sockets: every SDK sender is wrapped in a :class:`~._sockets.Guarded`, so the
AMQP connections it opened are closed when an open times out or is
cancelled, when a sender is dropped after a failure, and on ``close()``. The
SDK alone leaves some of them to the garbage collector (see ``_sockets``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from typing import Any

from azure.servicebus.exceptions import MessageSizeExceededError, ServiceBusServerBusyError

from outrelay.kit import (
    Capabilities,
    Delivered,
    LifecycleTransport,
    Message,
    Progress,
    Reader,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    Template,
    current_progress,
    deferred,
    not_sent,
)
from outrelay.transports.servicebus._client import make_client, open_sender
from outrelay.transports.servicebus._config import ServiceBusConfig
from outrelay.transports.servicebus._errors import ERRORS, result
from outrelay.transports.servicebus._reader import ServiceBusReader
from outrelay.transports.servicebus._sockets import CLOSE_BOUND, Guarded
from outrelay.transports.servicebus._wire import encode

__all__ = ["ServiceBusConfig", "ServiceBusTransport"]


class _Outcomes:
    """The results of one ``send``, each reported to the progress as it becomes known."""

    def __init__(self, batch: Sequence[Message], progress: Progress) -> None:
        self.batch = batch
        self.progress = progress
        self.results: list[SendResult | None] = [None] * len(batch)
        self.failed: set[str] = set()  # keys with a failure: nothing later of theirs is sent
        self.latency = 0.0  # of the last Service Bus batch sent
        self.declined = False  # the deadline or a stop: start nothing more

    def settle(self, i: int, r: SendResult) -> None:
        self.results[i] = r
        self.progress.report(self.batch[i], r)
        if not isinstance(r, Delivered):
            self.failed.add(self.batch[i].key)

    def skipped(self, i: int) -> bool:
        """Whether message ``i`` is not to be sent (and its result set so)."""
        if self.declined:
            self.results[i] = deferred(self.progress)
        elif self.batch[i].key in self.failed:
            self.results[i] = not_sent(self.batch[i].key)
        else:
            return False
        return True

    def may_start(self, members: list[int]) -> bool:
        """Whether the batch of ``members`` may be sent now (else they are deferred)."""
        if not self.declined and self.progress.may_start(self.latency):
            return True
        self.declined = True
        for i in members:
            self.results[i] = deferred(self.progress)
        return False

    def filled(self) -> list[SendResult]:
        return [r if r is not None else RetryLater("no outcome recorded") for r in self.results]


class ServiceBusTransport(LifecycleTransport[ServiceBusConfig]):
    """See the module docstring."""

    name = "servicebus"
    Config = ServiceBusConfig
    errors = ERRORS

    def __init__(self, config: ServiceBusConfig, *, destination: str = "servicebus") -> None:
        super().__init__(config, destination=destination)
        where = f"destinations.{destination}.{config.entity_option}"  # the option is queue or topic
        self._template = Template(config.entity, where=where, segment="name", alphabet=r"A-Za-z0-9._\-")
        self._client: Any = None
        self._senders: dict[str, Guarded] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    @property
    def capabilities(self) -> Capabilities:
        c = self.cfg
        return Capabilities(
            ordering_by_key=c.sessions,
            ordered_batches=True,
            native_dedupe=c.duplicate_detection,
            dedupe_window=c.dedupe_window if c.duplicate_detection else None,
            max_batch_count=1000,
            max_message_bytes=c.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
        )

    # -- lifecycle -------------------------------------------------------------------

    async def _open(self) -> None:
        """Make the client; with a static target, attach its sender (so open proves the entity)."""
        self._client = make_client(self.cfg)
        if self._template is not None and self._template.is_static:
            await self._sender(self._template.source)

    async def _close(self) -> None:
        """Close every sender and the client; every socket they opened is closed when this returns."""
        senders, self._senders = list(self._senders.values()), {}
        client, self._client = self._client, None
        for guarded in senders:
            await guarded.close()
        if client is not None:
            with contextlib.suppress(Exception):  # closing must not fail; nothing is confirmed after close
                await asyncio.wait_for(client.close(), CLOSE_BOUND)

    async def _check(self) -> str:
        entity = self.check_target()
        await self._sender(entity)
        return f"{self.cfg.entity_option} {entity!r} on {self.cfg.endpoint}: sender attached"

    async def _sender(self, entity: str) -> Any:
        """The open SDK sender of ``entity`` (attached on first use, within open_timeout).

        :raises RetryableError: the transport was closed meanwhile.
        :raises Exception: the SDK's error or TimeoutError (nothing left open; callers map it).
        """
        guarded = self._senders.get(entity)
        if guarded is None:
            client = self._client
            if client is None:
                raise self._closed_error()
            guarded = await open_sender(client, self.cfg, entity)
            if self._client is not client:  # close() ran while this sender attached: it must not outlive it
                await guarded.close()
                raise self._closed_error()
            self._senders[entity] = guarded
        return guarded.sdk

    def _closed_error(self) -> RetryableError:
        return RetryableError(
            f"{self._what()} was closed during this call; open() it again", destination=self.destination
        )

    async def _drop_sender(self, entity: str) -> None:
        guarded = self._senders.pop(entity, None)
        if guarded is not None:
            await guarded.close()

    def reader(self, target: str, **options: Any) -> Reader:
        return ServiceBusReader(self.cfg, target, **options)

    # -- sending -------------------------------------------------------------------------

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        run = _Outcomes(batch, current_progress())
        # Consecutive messages to one entity (and, partitioned, one key) share Service Bus batches.
        group: list[int] = []
        for i, m in enumerate(batch):
            if group and not self._same_group(batch[group[0]], m):
                await self._send_group(run, group)
                group = []
            group.append(i)
        await self._send_group(run, group)
        return run.filled()

    def _same_group(self, a: Message, b: Message) -> bool:
        return a.target == b.target and (not self.cfg.partitioned or a.key == b.key)

    async def _send_group(self, run: _Outcomes, idx: list[int]) -> None:
        entity = run.batch[idx[0]].target
        # One SDK sender is not safe for concurrent sends (the relay may have several
        # batches in flight): they take turns per entity.
        async with self._locks.setdefault(entity, asyncio.Lock()):
            try:
                sender = await self._sender(entity)
            except Exception as exc:
                for i in idx:
                    if not run.skipped(i):
                        run.settle(i, result(exc, self.cfg, f"cannot attach a sender to {entity!r}"))
                return
            await self._pack(run, entity, sender, idx)

    def _encoded(self, run: _Outcomes, i: int) -> Any:
        """Message ``i`` as an SDK message, or None when it is not to be sent (its result set)."""
        m, limit = run.batch[i], self.cfg.max_message_bytes
        if run.skipped(i):
            return None
        if len(m.event.data) > limit:
            run.settle(i, Rejected(f"message of {len(m.event.data)} bytes exceeds max_message_bytes={limit}"))
            return None
        try:
            return encode(m, self.cfg)
        except Exception as exc:  # the SDK validates fields (lengths, types) here
            run.settle(i, result(exc, self.cfg))
            return None

    async def _pack(self, run: _Outcomes, entity: str, sender: Any, idx: list[int]) -> None:
        """Fill Service Bus batches with the messages ``idx`` in order, sending each when full."""
        current: Any = None
        members: list[int] = []
        for i in idx:
            msg = self._encoded(run, i)
            while msg is not None:
                if current is None:
                    current, members = await sender.create_message_batch(), []
                try:
                    current.add_message(msg)
                    members.append(i)
                    break
                except MessageSizeExceededError:
                    if not members:  # does not fit an empty batch
                        run.settle(i, Rejected(f"message does not fit the entity's {current.max_size_in_bytes} bytes"))
                        break
                    await self._flush(run, entity, sender, current, members)
                    current = None
                    msg = None if run.skipped(i) else msg
        if current is not None and members:
            await self._flush(run, entity, sender, current, members)

    async def _flush(self, run: _Outcomes, entity: str, sender: Any, sb_batch: Any, members: list[int]) -> None:
        """Send one Service Bus batch (all-or-nothing) and report its outcome for every member."""
        if not run.may_start(members):
            return
        loop = asyncio.get_running_loop()
        began = loop.time()
        try:
            await sender.send_messages(sb_batch, timeout=self.cfg.send_timeout)
            res: SendResult = Delivered()
        except Exception as exc:
            res = result(exc, self.cfg, f"send to {entity!r}")
            if not isinstance(exc, ServiceBusServerBusyError | MessageSizeExceededError):
                await self._drop_sender(entity)  # reconnect on the next send
        run.latency = loop.time() - began
        for i in members:
            run.settle(i, res)
