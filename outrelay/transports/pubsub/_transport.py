"""The ``pubsub`` transport: Google Cloud Pub/Sub through ``google-cloud-pubsub``.

Mapping (CloudEvents binary mode, the form Google's own Pub/Sub binding uses):

* data -> message data (the event's bytes, untouched);
* every CloudEvents attribute -> a ``ce-*`` attribute (so the event id
  travels as ``ce-id``), ``datacontenttype`` -> the ``content-type`` attribute;
* stream -> ``ordering_key`` when ``ordering`` is on.

Capabilities, honestly:

* ``native_dedupe`` is false: Pub/Sub has no publish-side deduplication
  (exactly-once delivery is a subscription feature and dedupes redeliveries,
  not publishes). Consumers dedupe on ``ce-id``.
* ``ordering_by_key`` and ``ordered_batches`` hold only with ``ordering``.
  The library's ordered sequencer sends the batches of one ordering key one
  Publish RPC at a time, in order; a failed RPC pauses the key and fails
  every later message of that key already queued (and, until
  ``resume_publish``, any new one). A Publish RPC is all-or-nothing, so once
  a message of a key fails no later message of that key in the batch can be
  delivered — those are reported :class:`RetryLater`, and the key is resumed
  before ``send`` returns so the relay's retry can publish again.

Progress: the messages are handed to the library at once, in batch order, from
a thread (``publish`` may block) (:func:`~outrelay.kit.send_pipelined`); each outcome is recorded as soon as
the send returns or is cut, and nothing is started once the relay stops.
Without ``ordering`` a later message of a failed stream may still be stored;
it stays Delivered and the possible break in order is logged
(:func:`~outrelay.kit.hold_after_failures`).

Failure modes: one table, ``_errors.ERRORS`` (gRPC errors to RetryLater or
Rejected; PERMISSION_DENIED / UNAUTHENTICATED to Rejected with
``disable_destination``). ``open`` raises RetryableError within
``open_timeout`` when the endpoint does not answer; ``check`` (the kit's)
leaves an open transport open.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Sequence
from typing import Any

from outrelay.kit import (
    Capabilities,
    Delivered,
    LifecycleTransport,
    Message,
    Reader,
    Rejected,
    RetryLater,
    SendResult,
    failing_staged,
    not_sent,
    send_pipelined,
)
from outrelay.transports.pubsub._client import make_publisher, stop_publisher, wait_ready
from outrelay.transports.pubsub._config import PubSubConfig
from outrelay.transports.pubsub._errors import ERRORS
from outrelay.transports.pubsub._reader import PubSubReader
from outrelay.transports.pubsub._wire import attributes

__all__ = ["PubSubConfig", "PubSubTransport"]

log = logging.getLogger("outrelay.transports.pubsub")


class PubSubTransport(LifecycleTransport[PubSubConfig]):
    """See the module docstring."""

    name = "pubsub"
    Config = PubSubConfig
    errors = ERRORS
    target_option = "topic"
    target_segment = "name"
    target_alphabet = r"A-Za-z0-9._~+\-"

    def __init__(self, config: PubSubConfig, *, destination: str = "pubsub") -> None:
        super().__init__(config, destination=destination)
        self._client: Any = None

    @property
    def capabilities(self) -> Capabilities:
        c = self.cfg
        return Capabilities(
            ordering_by_key=c.ordering,
            ordered_batches=c.ordering,
            native_dedupe=False,
            max_batch_count=c.max_messages,
            max_batch_bytes=c.max_batch_bytes,
            max_message_bytes=c.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
        )

    async def _open(self) -> None:
        client = await asyncio.to_thread(make_publisher, self.cfg)  # builds a gRPC channel: not on the loop
        self._client = client  # _close releases it if the channel never gets ready
        await asyncio.to_thread(wait_ready, client, self.cfg)

    async def _close(self) -> None:
        client, self._client = self._client, None
        if client is not None:  # stop() flushes and joins threads: not on the loop
            await asyncio.to_thread(stop_publisher, client)

    async def _check(self) -> str:
        """The topic exists (static template), or the project answers (templated)."""
        where, timeout = self.cfg.endpoint, self.cfg.open_timeout
        if self._template is not None and self._template.is_static:
            topic = self.cfg.topic_path(self.check_target())
            with ERRORS.boundary(f"cannot reach topic {topic}", destination=self.destination):
                await asyncio.to_thread(self._client.get_topic, topic=topic, timeout=timeout)
            return f"topic {topic} exists ({where})"
        project = f"projects/{self.cfg.project}"
        with ERRORS.boundary(f"cannot list the topics of {project}", destination=self.destination):
            await asyncio.to_thread(lambda: next(iter(self._client.list_topics(project=project, timeout=timeout)), 0))
        return f"project {project} reachable ({where}); topics from template {self.cfg.topic!r}"

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        loop, client = asyncio.get_running_loop(), self._client
        staged: list[tuple[Message, asyncio.Future[Any]]] = []

        async def stage(m: Message) -> asyncio.Future[Any] | SendResult:
            if len(m.event.data) > self.cfg.max_message_bytes:
                return Rejected(
                    f"message of {len(m.event.data)} bytes exceeds max_message_bytes={self.cfg.max_message_bytes}"
                )
            staged.append((m, future := loop.create_future()))
            return future

        async def flush() -> None:
            # publish() may block (it starts the library's commit thread): never on the event loop
            with failing_staged([f for _, f in staged]):
                handed = await asyncio.to_thread(self._publish_all, client, [m for m, _ in staged])
            for (m, future), h in zip(staged, handed, strict=True):
                if h is None:
                    future.set_result(not_sent(m.key))
                elif isinstance(h, BaseException):
                    future.set_exception(h)
                else:
                    asyncio.wrap_future(h).add_done_callback(functools.partial(_settle, future))

        out: list[SendResult] = []
        try:
            out = await send_pipelined(
                batch,
                stage,
                self._outcome,
                timeout=self.cfg.publish_timeout,
                destination=self.destination,
                log=log,
                fix="set ordering = true",
                flush=flush,
            )
            return out
        finally:
            if self.cfg.ordering:  # a cut send resumes every key of the batch
                self._resume_failed_keys(batch, out or [RetryLater("cut")] * len(batch))

    def _publish_all(self, client: Any, messages: Sequence[Message]) -> list[Any]:
        """Hand ``messages`` to the library's batcher in order (blocking: call it in a thread). Per
        message: its publish future, the exception ``publish`` raised at once (too large, stopped
        publisher), or None (an earlier message of its key raised: not handed over)."""
        halted: set[str] = set()
        out: list[Any] = []
        for m in messages:
            if m.key in halted:
                out.append(None)
                continue
            key = m.key if self.cfg.ordering else ""
            try:
                out.append(
                    client.publish(self.cfg.topic_path(m.target), m.event.data, ordering_key=key, **attributes(m.event))
                )
            except Exception as exc:
                out.append(exc)
                halted.add(m.key)
        return out

    def _outcome(self, m: Message, future: asyncio.Future[Any]) -> SendResult:
        if future.cancelled():
            return RetryLater(f"publish not confirmed within publish_timeout={self.cfg.publish_timeout}s")
        exc = future.exception()
        if exc is not None:
            return ERRORS.result(exc, "publish")
        result = future.result()  # the message id, or the result of a message not handed over
        return result if isinstance(result, SendResult) else Delivered()

    def _resume_failed_keys(self, batch: Sequence[Message], results: Sequence[SendResult]) -> None:
        """Unpause every ordering key that failed, so the relay's retry can publish it.

        The relay never sends a later event of a failed stream before the
        retry of the failed one (invariant 3), so resuming here is safe.
        """
        for m, r in zip(batch, results, strict=True):
            if not isinstance(r, Delivered) and self._client is not None:
                # not paused (a timeout, or resumed already) or publisher stopped: nothing to do
                with contextlib.suppress(RuntimeError, ValueError):
                    self._client.resume_publish(self.cfg.topic_path(m.target), m.key)

    def reader(self, target: str, **options: Any) -> Reader:
        return PubSubReader(self.cfg, self.cfg.topic_path(target), ordering=self.cfg.ordering, **options)


def _settle(target: asyncio.Future[Any], source: asyncio.Future[Any]) -> None:
    """Copy ``source``'s outcome to ``target`` unless that is done already (cut by the timeout)."""
    exc = None if source.cancelled() else source.exception()  # retrieved either way: no "never retrieved"
    if target.done():
        return
    if source.cancelled():
        target.cancel()
    elif exc is not None:
        target.set_exception(exc)
    else:
        target.set_result(source.result())
