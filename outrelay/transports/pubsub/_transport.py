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

Failure modes: gRPC errors map to RetryLater (UNAVAILABLE, RESOURCE_EXHAUSTED,
DEADLINE_EXCEEDED, NOT_FOUND: fixable without losing the event) or Rejected
(INVALID_ARGUMENT, too large, and PERMISSION_DENIED / UNAUTHENTICATED:
credentials that may not publish would otherwise be retried for ever — the
conformance suite's rule; those are Rejected with ``disable_destination``,
so the destination stops and its events stay pending until the role is
granted and an operator runs ``outrelay enable``). ``open`` raises
RetryableError within ``open_timeout`` when the endpoint does not answer.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from outrelay.kit import (
    Capabilities,
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
from outrelay.transports.pubsub._config import PubSubConfig, make_publisher
from outrelay.transports.pubsub._reader import PubSubReader

__all__ = ["PubSubConfig", "PubSubTransport"]

CONTENT_TYPE_ATTR = "content-type"
_PAUSED = "an earlier message with this ordering key failed"


def classify(exc: BaseException) -> SendResult:
    """Map one publish failure to a per-message result (the one boundary)."""
    from google.api_core import exceptions as gexc
    from google.cloud.pubsub_v1.publisher import exceptions as pexc

    if isinstance(exc, pexc.PublishToPausedOrderingKeyException):
        return RetryLater(_PAUSED)
    if isinstance(exc, pexc.MessageTooLargeError):
        return Rejected(f"message too large for Pub/Sub: {exc}")
    if isinstance(exc, gexc.InvalidArgument):
        return Rejected(f"Pub/Sub rejected the message (INVALID_ARGUMENT): {exc.message}")
    if isinstance(exc, gexc.NotFound):
        return RetryLater(f"topic not found (create it or fix destinations.*.topic): {exc.message}")
    if isinstance(exc, gexc.PermissionDenied | gexc.Unauthenticated):
        return Rejected(
            f"not allowed to publish (grant roles/pubsub.publisher, or fix the credentials, then `outrelay enable` "
            f"the destination): {exc.message}",
            disable_destination=True,
        )
    if isinstance(exc, gexc.GoogleAPICallError):
        return RetryLater(f"Pub/Sub {type(exc).__name__}: {exc.message}")
    if isinstance(exc, TimeoutError | concurrent.futures.TimeoutError):
        return RetryLater("publish timed out")
    if isinstance(exc, RuntimeError):  # the library's "publisher stopped" and friends
        return RetryLater(f"publisher unusable: {exc}")
    return RetryLater(f"unexpected {type(exc).__name__} while publishing")


@contextmanager
def map_errors(destination: str, what: str) -> Iterator[None]:
    """Turn library exceptions outside ``send`` into outrelay errors."""
    try:
        yield
    except TransportError:
        raise
    except Exception as exc:
        from google.auth import exceptions as aexc

        if isinstance(exc, aexc.DefaultCredentialsError):
            raise PermanentError(
                f"{what}: no Google credentials (set credentials_file, run `gcloud auth application-default login`,"
                " or set emulator_host)",
                destination=destination,
            ) from exc
        result = classify(exc)
        if isinstance(result, Rejected):
            raise PermanentError(f"{what}: {result.reason}", destination=destination) from exc
        assert isinstance(result, RetryLater)
        raise RetryableError(f"{what}: {result.error}", destination=destination) from exc


class PubSubTransport(Transport):
    """See the module docstring."""

    name = "pubsub"
    Config = PubSubConfig

    def __init__(self, config: PubSubConfig, *, destination: str = "pubsub") -> None:
        super().__init__(config, destination=destination)
        self.cfg: PubSubConfig = config
        self._template = Template(
            config.topic, where=f"destinations.{destination}.topic", segment="name", alphabet=r"A-Za-z0-9._~+\-"
        )
        self._client: Any = None
        self._state = "new"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=self.cfg.ordering,
            ordered_batches=self.cfg.ordering,
            native_dedupe=False,
            max_batch_count=self.cfg.max_messages,
            max_batch_bytes=self.cfg.max_batch_bytes,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
        )

    def target(self, event: Event) -> str:
        return self._template.render(event)

    async def open(self) -> None:
        if self._state == "open":
            return
        with map_errors(self.destination, "cannot open Pub/Sub publisher"):
            client = make_publisher(self.cfg)
        try:
            await asyncio.to_thread(self._wait_ready, client)
        except BaseException:
            client.stop()
            raise
        self._client = client
        self._state = "open"

    def _wait_ready(self, client: Any) -> None:
        import grpc  # type: ignore[import-untyped]

        channel = client.transport.grpc_channel
        try:
            grpc.channel_ready_future(channel).result(timeout=self.cfg.open_timeout)
        except grpc.FutureTimeoutError as exc:
            where = self.cfg.emulator_host or "pubsub.googleapis.com"
            raise RetryableError(
                f"Pub/Sub endpoint {where} did not answer within {self.cfg.open_timeout}s",
                destination=self.destination,
            ) from exc

    def _attributes(self, event: Event) -> dict[str, str]:
        attrs = binary_headers(event, prefix="ce-")
        if event.content_type:
            attrs[CONTENT_TYPE_ATTR] = event.content_type
        return attrs

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        if self._state != "open":
            raise UsageError(f"pubsub transport {self.destination!r} is {self._state}, not open")
        client = self._client
        limit = self.cfg.max_message_bytes
        results: list[SendResult | None] = [None] * len(batch)
        pending: list[tuple[int, asyncio.Future[Any]]] = []
        held: set[str] = set()  # keys with a failure before publishing: nothing later of theirs goes out
        for i, m in enumerate(batch):
            if m.key in held:
                results[i] = RetryLater(_PAUSED)
                continue
            if len(m.event.data) > limit:
                results[i] = Rejected(f"message of {len(m.event.data)} bytes exceeds max_message_bytes={limit}")
                held.add(m.key)
                continue
            topic = self.cfg.topic_path(m.target)
            try:
                fut = client.publish(
                    topic, m.event.data, ordering_key=m.key if self.cfg.ordering else "", **self._attributes(m.event)
                )
            except Exception as exc:  # raised synchronously: too large, stopped publisher
                results[i] = classify(exc)
                held.add(m.key)
                continue
            pending.append((i, asyncio.wrap_future(fut)))
        if pending:
            _, not_done = await asyncio.wait([f for _, f in pending], timeout=self.cfg.publish_timeout)
            for f in not_done:
                f.cancel()
            for i, f in pending:
                if f in not_done:
                    results[i] = RetryLater(f"publish not confirmed within {self.cfg.publish_timeout}s")
                elif f.exception() is not None:
                    results[i] = classify(f.exception())  # type: ignore[arg-type]
                else:
                    results[i] = Delivered()
        out: list[SendResult] = [r if r is not None else RetryLater("not sent") for r in results]
        if self.cfg.ordering:
            self._resume_failed_keys(batch, out)
        return out

    def _resume_failed_keys(self, batch: Sequence[Message], results: Sequence[SendResult]) -> None:
        """Unpause every ordering key that failed, so the relay's retry can publish it.

        The relay never sends a later event of a failed stream before the
        retry of the failed one (invariant 3), so resuming here is safe.
        """
        for m, r in zip(batch, results, strict=True):
            if isinstance(r, RetryLater):
                # not paused (a timeout, or resumed already) or publisher stopped: nothing to do
                with contextlib.suppress(RuntimeError, ValueError):
                    self._client.resume_publish(self.cfg.topic_path(m.target), m.key)

    async def close(self) -> None:
        client, self._client = self._client, None
        if self._state == "open":
            self._state = "closed"
        if client is not None:
            # stop() flushes pending batches and joins the library's threads;
            # closing must not fail: nothing is confirmed after close anyway.
            with contextlib.suppress(Exception):
                await asyncio.to_thread(client.stop)
            with contextlib.suppress(Exception):  # grpc's channel close waits on its threads: not on the loop
                await asyncio.to_thread(client.transport.close)

    async def check(self) -> str:
        probe = Event(type="check", stream="check")
        topic = self.cfg.topic_path(self.target(probe))
        await self.open()
        try:
            with map_errors(self.destination, f"cannot reach topic {topic}"):
                if self._template.is_static:
                    await asyncio.to_thread(self._client.get_topic, topic=topic, timeout=self.cfg.open_timeout)
                    return f"topic {topic} exists ({self.cfg.emulator_host or 'pubsub.googleapis.com'})"
                project = f"projects/{self.cfg.project}"
                await asyncio.to_thread(
                    lambda: next(iter(self._client.list_topics(project=project, timeout=self.cfg.open_timeout)), None)
                )
                return f"project {project} reachable; topics from template {self.cfg.topic!r}"
        finally:
            await self.close()

    def reader(self, target: str, **options: Any) -> Reader:
        return PubSubReader(self.cfg, self.cfg.topic_path(target), ordering=self.cfg.ordering, **options)
