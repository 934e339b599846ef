"""The ``kafka`` transport: aiokafka producer, CloudEvents Kafka binding.

Mapping (:mod:`._wire`): the event's stream is the record **key** (so the
default murmur2 partitioner, the same as the Java client's, keeps one stream
in one partition); the record timestamp is the event time. Binary mode
(default) puts the attributes in ``ce_*`` headers plus a ``content-type``
header and the data verbatim in the value; structured mode puts the JSON
CloudEvent in the value with ``content-type: application/cloudevents+json``.

Sending: a batch is split per (topic, partition) into aiokafka record
batches (``create_batch``/``send_batch``); every partition's batch is
submitted at once and all are awaited together (pipelining). A record batch
is appended by the broker atomically, and aiokafka keeps one produce request
per partition in flight and re-queues retried batches at the head, so the
records of one partition land in batch order. When a partition's traffic
spans several record batches (over ``batch_bytes``) they are sent one after
the other, and after a failure the rest are reported NotSent, unsent.
That is what makes ``ordered_batches`` honest — as long as every event of a
stream goes to the same topic, i.e. the topic template uses no field other
than ``{stream}``. With ``{type}``-style templates one stream can span
topics that are written concurrently, so ``ordered_batches`` is declared
false and the relay sends one event per stream per batch instead.

Progress: each record batch's outcome is recorded in the send's progress
(:func:`~outrelay.kit.current_progress`) when the send returns or is cut; a
partition's next record batch is started only while its predecessor's
latency still fits before the deadline, and none once the relay is
stopping (else NotSent: it goes with the next claim).
A record batch in flight when the send is cut may still be stored by the
broker (aiokafka keeps it): at least once, as after any timeout.

Consuming: ``subscription()`` gives consumer groups and fan-out
(:mod:`outrelay.transports.kafka._subscription`), ``reader()`` a plain reader.

Not deduplicated by event id (``native_dedupe`` false): the idempotent
producer only drops its own retries within one producer session.

:raises RetryableError: from ``open`` when the cluster is unreachable within
    ``connect_timeout`` (never hangs).
:raises PermanentError: from ``open`` when the TLS files cannot be loaded (a
    wrong ``ssl_password``...), the broker refuses the SASL login, or it refuses
    an idempotent producer; one line saying what to fix, never a secret
    (see :mod:`._client`).
"""

from __future__ import annotations

import asyncio
import contextlib
import string
from collections.abc import Sequence
from typing import Any, ClassVar

from aiokafka import AIOKafkaProducer
from aiokafka.partitioner import DefaultPartitioner

from outrelay.kit import (
    Capabilities,
    Delivered,
    ErrorMap,
    LifecycleTransport,
    Message,
    NotSent,
    PermanentError,
    Progress,
    Reader,
    Rejected,
    RetryLater,
    SendResult,
    SubscriptionBackend,
    SubscriptionSpec,
    current_progress,
    deferred,
    not_sent,
)
from outrelay.transports.kafka._client import start_producer
from outrelay.transports.kafka._config import TOPIC_RE, KafkaConfig
from outrelay.transports.kafka._errors import ERRORS, describe
from outrelay.transports.kafka._reader import KafkaReader
from outrelay.transports.kafka._subscription import subscription_for
from outrelay.transports.kafka._wire import encode

__all__ = ["KafkaConfig", "KafkaTransport"]

_HELD = "not sent: an earlier record batch of this partition failed in this send"

#: (record batch builder, indices of its messages in the send's batch), in partition order
Chain = list[tuple[Any, list[int]]]


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a batch future's outcome as seen (it may finish after we stopped waiting)."""
    if not fut.cancelled():
        fut.exception()


class KafkaTransport(LifecycleTransport[KafkaConfig]):
    """See the module docstring."""

    name = "kafka"
    Config = KafkaConfig
    errors: ClassVar[ErrorMap] = ERRORS
    target_option = "topic"
    target_segment = "name"
    target_alphabet = r"A-Za-z0-9._\-"

    def __init__(self, config: KafkaConfig, *, destination: str = "kafka") -> None:
        super().__init__(config, destination=destination)
        fields = {f for _, f, _, _ in string.Formatter().parse(config.topic) if f is not None}
        self._ordered = fields <= {"stream"}
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[tuple[bytes, int], int] = {}
        self._producer: AIOKafkaProducer | None = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(ordering_by_key=True, ordered_batches=self._ordered, native_dedupe=False,
                            max_batch_count=1000, max_message_bytes=self.cfg.max_message_bytes,
                            cloudevents_modes=("binary", "structured"), reader=True, subscriptions=True)  # fmt: skip

    async def _open(self) -> None:
        self._producer = await start_producer(self.cfg, self.destination)

    async def _close(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            with contextlib.suppress(Exception):  # closing: nothing useful to report to the caller
                async with asyncio.timeout(self.cfg.request_timeout):
                    await producer.stop()

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        producer = self._producer
        assert producer is not None  # the kit calls _send only while open
        progress = current_progress()
        results: list[SendResult | None] = [None] * len(batch)
        try:
            chains = self._plan(producer, batch, await self._topics(producer, batch), results)
            sends = (self._send_chain(producer, t, p, c, batch, results, progress) for (t, p), c in chains.items())
            await asyncio.gather(*sends)
        finally:  # returned or cut: what is known is kept
            progress.record(batch, results)
        return [r if r is not None else RetryLater("no outcome recorded") for r in results]

    async def _topics(self, producer: AIOKafkaProducer, batch: Sequence[Message]) -> dict[str, list[int] | SendResult]:
        """The sorted partitions of every topic of ``batch``, or the result of its messages when unknown."""
        found: dict[str, list[int] | SendResult] = {}
        for topic in {m.target for m in batch}:
            if not TOPIC_RE.match(topic):  # a rendered template may hold characters Kafka forbids
                found[topic] = Rejected(
                    f"{topic!r} is not a valid Kafka topic name (letters, digits, '.', '_', '-'; at most 249)"
                )
                continue
            try:
                async with asyncio.timeout(self.cfg.request_timeout):
                    found[topic] = sorted(await producer.partitions_for(topic))
            except Exception as exc:
                found[topic] = ERRORS.result(exc, f"kafka metadata for topic {topic!r}")
        return found

    def _plan(
        self,
        producer: AIOKafkaProducer,
        batch: Sequence[Message],
        topics: dict[str, list[int] | SendResult],
        results: list[SendResult | None],
    ) -> dict[tuple[str, int], Chain]:
        """Fill record batches per (topic, partition) in batch order; what cannot go is given its result."""
        failed: set[str] = set()
        chains: dict[tuple[str, int], Chain] = {}
        limit = self.cfg.max_message_bytes
        for i, m in enumerate(batch):
            parts = topics[m.target]
            if m.key in failed:
                results[i] = not_sent(m.key)
                continue
            if len(m.event.data) > limit:
                results[i] = Rejected(f"message of {len(m.event.data)} bytes exceeds max_message_bytes={limit}")
            elif not isinstance(parts, list):
                results[i] = parts
            elif not self._append(producer, chains, m, self._partition(m.key.encode(), parts), i):
                results[i] = Rejected("record does not fit into an empty record batch; raise batch_bytes")
            if results[i] is not None:
                failed.add(m.key)
        return chains

    def _append(
        self, producer: AIOKafkaProducer, chains: dict[tuple[str, int], Chain], m: Message, partition: int, i: int
    ) -> bool:
        """Append ``m`` to its partition's last record batch, or a new one; False: it fits in none."""
        chain = chains.setdefault((m.target, partition), [])
        value, headers = encode(m.event, self.cfg.mode)
        record = {"key": m.key.encode(), "value": value, "timestamp": int(m.event.time.timestamp() * 1000)}
        if not chain or chain[-1][0].append(**record, headers=headers) is None:
            builder = producer.create_batch()
            if builder.append(**record, headers=headers) is None:
                return False
            chain.append((builder, []))
        chain[-1][1].append(i)
        return True

    def _partition(self, key: bytes, parts: list[int]) -> int:
        """murmur2(key) like the Java client, memoised: pure Python murmur2 costs ~40 µs a call."""
        cache_key = (key, len(parts))
        partition = self._partitions.get(cache_key)
        if partition is None:
            if len(self._partitions) >= 100_000:
                self._partitions.clear()
            partition = self._partitions[cache_key] = self._partitioner(key, parts, parts)
        return partition

    async def _send_chain(
        self,
        producer: AIOKafkaProducer,
        topic: str,
        partition: int,
        chain: Chain,
        batch: Sequence[Message],
        results: list[SendResult | None],
        progress: Progress,
    ) -> None:
        """Send one partition's record batches in order; stop at the first failure, or when the
        deadline leaves no room for another (the previous one's latency)."""
        loop = asyncio.get_running_loop()
        latency = 0.0
        for n, (builder, indices) in enumerate(chain):
            if not progress.may_start(latency if n else 0.0):  # a partition's first: unless the relay stops
                self._hold(chain[n:], results, deferred(progress))
                return
            began = loop.time()
            outcome = await self._produce(producer, topic, partition, builder)
            latency = loop.time() - began
            for i in indices:
                results[i] = outcome
            if not isinstance(outcome, Delivered):
                self._hold(chain[n + 1 :], results, NotSent(_HELD))
                return

    @staticmethod
    def _hold(rest: Chain, results: list[SendResult | None], result: SendResult) -> None:
        for _, indices in rest:
            for i in indices:
                results[i] = result

    async def _produce(self, producer: AIOKafkaProducer, topic: str, partition: int, builder: Any) -> SendResult:
        """Send one record batch and wait for the broker's answer (at most ``request_timeout`` + 5 s)."""
        try:
            builder.close()
            fut = await producer.send_batch(builder, topic, partition=partition)
            fut.add_done_callback(_consume)
            # shield: on our timeout aiokafka keeps the batch and may still deliver it (at least once);
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation
            async with asyncio.timeout(self.cfg.request_timeout + 5):
                await asyncio.shield(fut)
        except TimeoutError:
            return RetryLater(f"kafka produce to {topic}[{partition}] timed out")
        except Exception as exc:
            return ERRORS.result(exc, f"kafka produce to {topic}[{partition}]")
        return Delivered()

    async def _check(self) -> str:
        """Reachability, and the topic's partitions when the template is static.

        Kafka cannot test WRITE permission without writing; an ACL problem
        shows up as a Rejected "TopicAuthorizationFailed" on the first send.

        :raises PermanentError: the static topic is not available (create it).
        """
        producer = self._producer
        assert producer is not None  # the kit calls _check only while open
        cfg = self.cfg
        brokers = len(producer.client.cluster.brokers())
        idempotence = "on" if cfg.enable_idempotence else "off"
        head = f"kafka {','.join(cfg.servers)} reachable ({brokers} broker(s), acks=all, idempotence {idempotence})"
        if self._template is None or not self._template.is_static:
            return f"{head}; topics from template {cfg.topic!r} are resolved at publish"
        try:
            async with asyncio.timeout(cfg.connect_timeout):
                parts = await producer.partitions_for(cfg.topic)
        except Exception as exc:
            raise PermanentError(
                f"kafka topic {cfg.topic!r} is not available ({describe(exc)}): create it "
                f"(kafka-topics.sh --create --topic {cfg.topic}) or enable auto.create.topics.enable",
                destination=self.destination,
            ) from exc
        return f"{head}; topic {cfg.topic!r} has {len(parts)} partition(s)"

    def reader(self, target: str, **options: Any) -> Reader:
        """A consumer-group reader of ``target`` (options: ``group_id``, ``from_beginning``)."""
        return KafkaReader(self.cfg, target, **options)

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A consumer-group (or fan-out) backend for ``spec``; ``spec.target == ""`` means this
        destination's topic. :raises PermanentError: see :func:`~._subscription.subscription_for`."""
        return subscription_for(self.cfg, spec, destination=self.destination)
