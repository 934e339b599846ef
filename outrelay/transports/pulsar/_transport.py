"""The ``pulsar`` transport: Apache Pulsar through ``pulsar-client``.

Mapping (CloudEvents binary mode): the body is the event data, the
properties are the CloudEvents attributes with the ``ce_`` prefix plus
``content-type``, the partition key is the stream (so a partitioned topic
keeps a stream on one partition, in order) and the event time is the
message's event timestamp. ``topic`` is a template
(``persistent://public/default/{category}``); one producer per topic,
created lazily and kept.

Sends are asynchronous: ``send_async`` callbacks (on the client's I/O
thread) resolve asyncio futures with ``loop.call_soon_threadsafe``; blocking
calls (producer creation, flush, close) run in a small executor with
bounded timeouts, so the event loop never blocks and a down broker fails
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

TLS: a ``pulsar+ssl://`` URL plus ``tls_trust_certs_file_path``; token
auth: ``token`` (a secret, never printed).

The C++ client logs to the console at ``client_log_level`` (default
``warn``); ``debug`` routes every line into the ``outrelay.transports.pulsar``
logger instead, at about half the throughput (the client calls Python for
each of its per-message debug lines).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pulsar

from outrelay.kit import (
    Capabilities,
    Delivered,
    Event,
    Message,
    Reader,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    Template,
    Transport,
    TransportError,
    UsageError,
)
from outrelay.transports.pulsar._config import PulsarConfig, properties
from outrelay.transports.pulsar._errors import Acks, call_blocking, map_pulsar_errors, outcome

__all__ = ["PulsarConfig", "PulsarTransport"]

log = logging.getLogger("outrelay.transports.pulsar")


class PulsarTransport(Transport):
    """See the module docstring."""

    name = "pulsar"
    Config = PulsarConfig

    def __init__(self, config: PulsarConfig, *, destination: str = "pulsar") -> None:
        super().__init__(config, destination=destination)
        self.cfg = config
        self._template = Template(
            config.topic, where=f"destinations.{destination}.topic", segment="name", alphabet=r"A-Za-z0-9._:=\-"
        )
        self.client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._named: dict[str, Any] = {}
        self._plain: dict[str, Any] = {}
        self._creating: dict[tuple[str, bool], asyncio.Task[Any]] = {}
        self._highest: dict[str, int] = {}
        self._confirmed: dict[str, set[int]] = {}
        self._state = "new"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=not self.cfg.deduplication,
            native_dedupe=self.cfg.deduplication,
            dedupe_window=None,
            max_batch_count=1000,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
        )

    def target(self, event: Event) -> str:
        return self._template.render(event)

    def make_client(self) -> Any:
        """A ``pulsar.Client`` for this config (does not connect yet)."""
        c = self.cfg
        auth = pulsar.AuthenticationToken(c.token.get_secret_value()) if c.token else None
        return pulsar.Client(
            c.service_url,
            authentication=auth,
            operation_timeout_seconds=max(1, int(c.operation_timeout)),
            connection_timeout_ms=int(c.connect_timeout * 1000),
            tls_trust_certs_file_path=c.tls_trust_certs_file_path,
            tls_allow_insecure_connection=c.tls_allow_insecure_connection,
            tls_validate_hostname=c.tls_validate_hostname,
            logger=self._client_logger(),
        )

    def _client_logger(self) -> Any:
        # The C++ client calls a Python logger for every DEBUG line (two per message), taking the GIL from its
        # I/O thread each time and halving throughput; only route into `logging` when asked to.
        level = self.cfg.client_log_level
        if level == "debug":
            return log
        return pulsar.ConsoleLogger(getattr(pulsar.LoggerLevel, level.capitalize()))

    async def open(self) -> None:
        """Create the client; for a static topic, create its producer now."""
        if self._state == "open":
            return
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="outrelay-pulsar")
        try:
            with map_pulsar_errors("pulsar client", self.destination):
                self.client = self.make_client()
            self._state = "open"
            if self._template.is_static:
                await self._producer(self.cfg.topic, named=self.cfg.deduplication)
        except BaseException:
            await self.close()
            self._state = "new"
            raise

    async def _blocking(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        if self._pool is None:
            raise UsageError(f"pulsar transport {self.destination!r} is {self._state}, not open")
        bound = self.cfg.connect_timeout + self.cfg.operation_timeout
        return await call_blocking(self._pool, bound, what, self.destination, fn, *args, **kwargs)

    async def _producer(self, topic: str, *, named: bool) -> Any:
        cache = self._named if named else self._plain
        if topic in cache:
            return cache[topic]
        key = (topic, named)
        task = self._creating.get(key)
        if task is None:
            c = self.cfg
            kwargs: dict[str, Any] = {
                "send_timeout_millis": int(c.send_timeout * 1000),
                "batching_enabled": c.batching,
                "batching_max_messages": c.batching_max_messages,
                "batching_max_publish_delay_ms": c.batching_max_publish_delay_ms,
                "max_pending_messages": c.max_pending_messages,
                "block_if_queue_full": False,
            }
            if named:
                kwargs["producer_name"] = c.producer_name or f"outrelay-{self.destination}"
            task = asyncio.ensure_future(
                self._blocking(f"pulsar create producer on {topic}", self.client.create_producer, topic, **kwargs)
            )
            self._creating[key] = task
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

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        if self._state != "open":
            raise UsageError(f"pulsar transport {self.destination!r} is {self._state}, not open")
        acks = Acks(asyncio.get_running_loop(), len(batch))
        results: list[SendResult | None] = [None] * len(batch)
        named_seq: dict[int, int] = {}
        failed_keys: set[str] = set()
        # A producer that cannot be created fails its topic's other messages at once, not one timeout each.
        failed_topics: dict[str, SendResult] = {}
        for i, m in enumerate(batch):
            early: SendResult | None = None
            if m.key in failed_keys:
                early = RetryLater("an earlier message with this key failed")
            elif m.target in failed_topics:
                early = failed_topics[m.target]
            elif len(m.event.data) > self.cfg.max_message_bytes:
                early = Rejected(
                    f"event data of {len(m.event.data)} bytes exceeds max_message_bytes={self.cfg.max_message_bytes}"
                )
            else:
                try:
                    early, seq = await self._submit(m, functools.partial(acks.done, i))
                    if seq is not None:
                        named_seq[i] = seq
                except TransportError as exc:
                    early = RetryLater(str(exc)) if isinstance(exc, RetryableError) else Rejected(str(exc))
                    if m.target not in self._named and m.target not in self._plain:
                        failed_topics[m.target] = early
            if early is not None:
                results[i] = early
                if not isinstance(early, Delivered):
                    failed_keys.add(m.key)
                acks.done(i, None, None)
        raw = await acks.wait()
        out: list[SendResult] = []
        for i, (m, r) in enumerate(zip(batch, results, strict=True)):
            if r is None:
                r = outcome(raw[i])
                if i in named_seq and isinstance(r, Delivered):
                    self._remember(m.target, named_seq[i])
            out.append(r)
        return out

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
        with map_pulsar_errors(f"pulsar send to {m.target}", self.destination):
            producer.send_async(m.event.data, callback, **kwargs)
        return None, seq if named else None

    def _remember(self, topic: str, seq: int) -> None:
        confirmed = self._confirmed.get(topic)
        if confirmed is not None:
            if len(confirmed) >= 200_000:  # bounded memory; forgetting only costs a possible duplicate
                confirmed.clear()
            confirmed.add(seq)

    async def close(self) -> None:
        producers = [*self._named.values(), *self._plain.values()]
        self._named.clear()
        self._plain.clear()
        client, self.client = self.client, None
        if self._pool is not None:
            for p in producers:
                try:
                    await self._blocking("pulsar close producer", p.close)
                except TransportError as exc:
                    log.warning("pulsar: %s", exc)
            if client is not None:
                try:
                    await self._blocking("pulsar close client", client.close)
                except TransportError as exc:
                    log.warning("pulsar: %s", exc)
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
        if self._state == "open":
            self._state = "closed"

    async def check(self) -> str:
        """One line: the broker accepted a producer on the (rendered) topic."""
        topic = self.target(Event(type="check", stream="check"))
        was_open = self._state == "open"
        try:
            if not was_open:
                await self.open()
            await self._producer(topic, named=self.cfg.deduplication)
        except TransportError as exc:
            raise type(exc)(
                f"{exc}; check service_url {self.cfg.service_url}, the token/TLS settings and that topic {topic} "
                "may be produced to",
                destination=self.destination,
            ) from exc
        finally:
            if not was_open:
                await self.close()
        return f"pulsar {self.cfg.service_url}: producer on {topic} accepted"

    def reader(self, target: str, **options: Any) -> Reader:
        from outrelay.transports.pulsar._reader import PulsarReader

        return PulsarReader(self, target, **options)
