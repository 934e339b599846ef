"""The ``pulsar`` transport: Apache Pulsar through ``pulsar-client``.

Mapping (CloudEvents binary mode): the body is the event data, the
properties are the CloudEvents attributes with the ``ce_`` prefix plus
``content-type``, the partition key is the stream (so a partitioned topic
keeps a stream on one partition, in order) and the event time is the
message's event timestamp. ``topic`` is a template
(``persistent://public/default/{category}``); one producer per topic,
created lazily and kept.

Sends are asynchronous: ``send_async`` callbacks (on the client's I/O
thread) are gathered per batch (:class:`~._client.Acks`); blocking
calls (producer creation, flush, close) run in a small executor with
bounded timeouts (:class:`~._client.Blocking`), so the event loop never blocks and a down broker fails
``open`` with :class:`~outrelay.RetryableError` after ``connect_timeout``.
Batching is on by default (``batching_max_publish_delay_ms``).

One producer publishes in order over one connection and fails the pending
messages after a failed one, so without deduplication the transport
declares ``ordered_batches``.

Deduplication (``deduplication = true``, only for a namespace where broker
deduplication is enabled): the named producer (``producer_name``, stable
across restarts) sends the outbox sequence number as ``sequence_id``. The
broker drops any sequence id not above the highest it has persisted for
that producer, and the relay sends streams in parallel and retries
failures later, so sequences arrive out of order. To never lose an event,
only a sequence above every one sent so far goes through the named
producer; a sequence this process already saw confirmed is reported
``Delivered(duplicate=True)`` without sending; any other (a retry of an
older event, or, after a restart, one at or below the broker's last
sequence id) goes through an unnamed producer without dedupe. Dedupe is
therefore exact within one relay process and at-least-once across
restarts; ``ordered_batches`` is off in this mode. Declare it only when the
namespace has deduplication enabled (``pulsar-admin namespaces
set-deduplication --enable``).

Progress: the outcomes that arrived are recorded in the send's progress
(:func:`~outrelay.kit.current_progress`) when the send returns or is cut, and
no message is handed to a producer once the relay is stopping.

TLS: a ``pulsar+ssl://`` URL plus ``tls_trust_certs_file_path``; token
auth: ``token`` (a secret, never printed). The client, its threads and its
log level: :mod:`._client`; errors: :mod:`._errors`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

from outrelay.kit import (
    Capabilities,
    Delivered,
    ErrorMap,
    LifecycleTransport,
    Message,
    Progress,
    Reader,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    TransportError,
    current_progress,
    deferred,
    not_sent,
    redact,
)
from outrelay.transports.pulsar._client import Acks, Blocking, log, make_client, producer_options
from outrelay.transports.pulsar._config import PulsarConfig
from outrelay.transports.pulsar._errors import ERRORS, outcome
from outrelay.transports.pulsar._reader import PulsarReader
from outrelay.transports.pulsar._wire import properties

__all__ = ["PulsarConfig", "PulsarTransport"]


class PulsarTransport(LifecycleTransport[PulsarConfig]):
    """See the module docstring."""

    name = "pulsar"
    Config = PulsarConfig
    errors: ClassVar[ErrorMap] = ERRORS
    target_option = "topic"
    target_segment = "name"
    target_alphabet = r"A-Za-z0-9._:=\-"

    def __init__(self, config: PulsarConfig, *, destination: str = "pulsar") -> None:
        super().__init__(config, destination=destination)
        self.client: Any = None
        self._blocking: Blocking | None = None
        self._named: dict[str, Any] = {}
        self._plain: dict[str, Any] = {}
        self._creating: dict[tuple[str, bool], asyncio.Task[Any]] = {}
        self._highest: dict[str, int] = {}
        self._confirmed: dict[str, set[int]] = {}

    @property
    def capabilities(self) -> Capabilities:
        dedupe = self.cfg.deduplication
        return Capabilities(ordering_by_key=True, ordered_batches=not dedupe, native_dedupe=dedupe, dedupe_window=None,
                            max_batch_count=1000, max_message_bytes=self.cfg.max_message_bytes,
                            cloudevents_modes=("binary",), reader=True)  # fmt: skip

    async def _open(self) -> None:
        """Create the client; for a static topic, create its producer now."""
        cfg = self.cfg
        self._blocking = Blocking(2, bound=cfg.connect_timeout + cfg.operation_timeout, destination=self.destination)
        with ERRORS.boundary("pulsar client", destination=self.destination):
            self.client = make_client(cfg)
        if self._template is not None and self._template.is_static:
            with self._hinted(cfg.topic):
                await self._producer(cfg.topic, named=cfg.deduplication)

    @contextlib.contextmanager
    def _hinted(self, topic: str) -> Iterator[None]:
        """A failure to get a producer on ``topic``, re-raised with what to check."""
        try:
            yield
        except TransportError as exc:
            raise type(exc)(
                f"{exc}; check service_url {redact(self.cfg.service_url)}, the token/TLS settings and that topic "
                f"{topic} may be produced to",
                destination=self.destination,
            ) from exc

    async def _blocking_call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._blocking is None:
            raise RetryableError(f"{what}: the pulsar transport was closed meanwhile", destination=self.destination)
        return await self._blocking.call(what, fn, *args, **kwargs)

    async def _producer(self, topic: str, *, named: bool) -> Any:
        """The producer of ``topic`` (created once, concurrent callers share the creation)."""
        cache = self._named if named else self._plain
        if topic in cache:
            return cache[topic]
        key = (topic, named)
        task = self._creating.get(key)
        if task is None:
            options = producer_options(self.cfg, self.destination, named=named)
            create = self._blocking_call(
                f"pulsar create producer on {topic}", self.client.create_producer, topic, **options
            )
            task = self._creating[key] = asyncio.ensure_future(create)
        try:
            producer = await asyncio.shield(task)
        finally:
            if task.done():
                self._creating.pop(key, None)
        if topic not in cache:
            cache[topic] = producer
            if named:
                self._highest[topic] = int(producer.last_sequence_id())
                self._confirmed[topic] = set()
        return cache[topic]

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        progress = current_progress()
        acks = Acks(asyncio.get_running_loop(), len(batch))
        results: list[SendResult | None] = [None] * len(batch)
        named_seq: dict[int, int] = {}
        try:
            await self._submit_all(batch, acks, results, named_seq, progress)
            await acks.wait()
        finally:  # returned or cut: every outcome that arrived is kept
            self._settle(batch, acks.results, results, named_seq)
            progress.record(batch, results)
        return [r if r is not None else RetryLater("no outcome recorded") for r in results]

    async def _submit_all(
        self,
        batch: Sequence[Message],
        acks: Acks,
        results: list[SendResult | None],
        named_seq: dict[int, int],
        progress: Progress,
    ) -> None:
        """Hand every message to its producer in batch order; what cannot go gets its result at once."""
        failed_keys: set[str] = set()
        # A producer that cannot be created fails its topic's other messages at once, not one timeout each.
        failed_topics: dict[str, SendResult] = {}
        limit = self.cfg.max_message_bytes
        for i, m in enumerate(batch):
            early: SendResult | None = None
            if m.key in failed_keys:
                early = not_sent(m.key)
            elif not progress.may_start():
                early = deferred(progress)
            elif m.target in failed_topics:
                early = failed_topics[m.target]
            elif len(m.event.data) > limit:
                early = Rejected(f"event data of {len(m.event.data)} bytes exceeds max_message_bytes={limit}")
            else:
                try:
                    early, seq = await self._submit(m, functools.partial(acks.done, i))
                    if seq is not None:
                        named_seq[i] = seq
                except TransportError as exc:
                    early = ERRORS.result(exc)
                    if m.target not in self._named and m.target not in self._plain:
                        failed_topics[m.target] = early
            if early is not None:
                results[i] = early
                if not isinstance(early, Delivered):
                    failed_keys.add(m.key)
                acks.done(i, None, None)

    def _settle(
        self, batch: Sequence[Message], raw: list[Any], results: list[SendResult | None], named_seq: dict[int, int]
    ) -> None:
        """Fill ``results`` from the callbacks that arrived; remember the confirmed sequence ids."""
        for i, r in enumerate(raw):
            if results[i] is None and r is not None:
                results[i] = done = outcome(r)
                if i in named_seq and isinstance(done, Delivered):
                    self._remember(batch[i].target, named_seq[i])

    async def _submit(self, m: Message, callback: Any) -> tuple[SendResult | None, int | None]:
        """Hand ``m`` to a producer; returns (an immediate result or None, the sequence id if named)."""
        seq = m.event.sequence if self.cfg.deduplication else None
        named = False
        if seq is not None:
            producer = await self._producer(m.target, named=True)
            if seq in self._confirmed[m.target]:
                return Delivered(duplicate=True), None
            named = seq > self._highest[m.target]
            if named:
                self._highest[m.target] = seq
        if not named:
            producer = await self._producer(m.target, named=False)
        kwargs: dict[str, Any] = {
            "properties": properties(m.event),
            "partition_key": m.key,
            "event_timestamp": int(m.event.time.timestamp() * 1000),
        }
        if named:
            kwargs["sequence_id"] = seq
        with ERRORS.boundary(f"pulsar send to {m.target}", destination=self.destination):
            producer.send_async(m.event.data, callback, **kwargs)
        return None, seq if named else None

    def _remember(self, topic: str, seq: int) -> None:
        confirmed = self._confirmed.get(topic)
        if confirmed is not None:
            if len(confirmed) >= 200_000:  # bounded memory; forgetting only costs a possible duplicate
                confirmed.clear()
            confirmed.add(seq)

    async def _close(self) -> None:
        producers = [*self._named.values(), *self._plain.values()]
        self._named.clear()
        self._plain.clear()
        client, self.client = self.client, None
        blocking, self._blocking = self._blocking, None
        if blocking is None:
            return
        for what, obj in [*(("pulsar close producer", p) for p in producers), ("pulsar close client", client)]:
            if obj is not None:
                try:
                    await blocking.call(what, obj.close)
                except TransportError as exc:
                    log.warning("pulsar: %s", exc)
        blocking.shutdown()

    async def _check(self) -> str:
        """One line: the broker accepted a producer on the (rendered) topic."""
        topic = self.check_target()
        with self._hinted(topic):
            await self._producer(topic, named=self.cfg.deduplication)
        return f"pulsar {redact(self.cfg.service_url)}: producer on {topic} accepted"

    def reader(self, target: str, **options: Any) -> Reader:
        """An exclusive-subscription reader of ``target`` (option: ``subscription``)."""
        return PulsarReader(self.cfg, target, destination=self.destination, **options)
