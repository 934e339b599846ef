"""The ``kafka`` transport: aiokafka producer, CloudEvents Kafka binding.

Mapping: the event's stream is the record **key** (so the default murmur2
partitioner, the same as the Java client's, keeps one stream in one
partition); the record timestamp is the event time. Binary mode (default)
puts the attributes in ``ce_*`` headers plus a ``content-type`` header and
the data verbatim in the value; structured mode puts the JSON CloudEvent in
the value with ``content-type: application/cloudevents+json``.

Sending: a batch is split per (topic, partition) into aiokafka record
batches (``create_batch``/``send_batch``); every partition's batch is
submitted at once and all are awaited together (pipelining). A record batch
is appended by the broker atomically, and aiokafka keeps one produce request
per partition in flight and re-queues retried batches at the head, so the
records of one partition land in batch order. When a partition's traffic
spans several record batches (over ``batch_bytes``) they are sent one after
the other, and after a failure the rest are reported RetryLater unsent.
That is what makes ``ordered_batches`` honest — as long as every event of a
stream goes to the same topic, i.e. the topic template uses no field other
than ``{stream}``. With ``{type}``-style templates one stream can span
topics that are written concurrently, so ``ordered_batches`` is declared
false and the relay sends one event per stream per batch instead.

Consuming: ``subscription()`` gives consumer groups and fan-out
(:mod:`outrelay.transports.kafka._subscriber`), ``reader()`` a plain reader.

Not deduplicated by event id (``native_dedupe`` false): the idempotent
producer only drops its own retries within one producer session.

:raises RetryableError: from ``open`` when the cluster is unreachable within
    ``connect_timeout`` (never hangs).
:raises PermanentError: from ``open`` when the TLS files cannot be loaded (a
    wrong ``ssl_password``...), the broker refuses the SASL login, or it refuses
    an idempotent producer; one line saying what to fix, never a secret.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import string
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka import errors as ke
from aiokafka.partitioner import DefaultPartitioner

from outrelay.kit import (
    STRUCTURED_CONTENT_TYPE,
    Capabilities,
    Delivered,
    Event,
    Message,
    PermanentError,
    Reader,
    Rejected,
    RetryLater,
    SendResult,
    SubscriptionBackend,
    SubscriptionSpec,
    Template,
    Transport,
    UsageError,
    binary_headers,
    certificate_refused,
    tls_hint,
    to_structured,
)
from outrelay.transports.kafka._config import TOPIC_RE, KafkaConfig
from outrelay.transports.kafka._errors import describe, map_kafka_errors, result_for

__all__ = ["KafkaConfig", "KafkaTransport", "client_options", "encode"]

_HELD = "held back: an earlier record of this partition failed in this batch"


def _consume(fut: asyncio.Future[Any]) -> None:
    """Mark a batch future's outcome as seen (it may finish after we stopped waiting)."""
    if not fut.cancelled():
        fut.exception()


def _ssl_context(cfg: KafkaConfig) -> ssl.SSLContext:
    """The TLS context of ``cfg``.

    :raises PermanentError: a CA, certificate or key file cannot be read, the key is encrypted and
        ``ssl_password`` does not open it, or the key does not match the certificate.
    """
    try:
        ctx = ssl.create_default_context(cafile=cfg.ssl_cafile)
        ctx.check_hostname = cfg.ssl_check_hostname
        if cfg.ssl_certfile:
            password = cfg.ssl_password.get_secret_value() if cfg.ssl_password else None
            ctx.load_cert_chain(cfg.ssl_certfile, cfg.ssl_keyfile, password=password)
    except OSError as exc:  # ssl.SSLError is one ("PEM lib": a wrong ssl_password, a key of another certificate)
        raise PermanentError(
            f"kafka TLS files could not be loaded ({type(exc).__name__}: {exc}): check ssl_cafile, ssl_certfile "
            "and ssl_keyfile, that the key belongs to the certificate, and ssl_password if the key is encrypted"
        ) from exc
    return ctx


def client_options(cfg: KafkaConfig) -> dict[str, Any]:
    """Connection and security keyword arguments shared by producer, consumer and admin.

    :raises PermanentError: the TLS files cannot be loaded (see :func:`_ssl_context`).
    """
    opts: dict[str, Any] = {
        "bootstrap_servers": cfg.servers,
        "client_id": cfg.client_id,
        "request_timeout_ms": int(cfg.request_timeout * 1000),
        "security_protocol": cfg.security_protocol,
    }
    if cfg.security_protocol in ("SSL", "SASL_SSL"):
        opts["ssl_context"] = _ssl_context(cfg)
    if cfg.sasl_mechanism is not None:
        opts["sasl_mechanism"] = cfg.sasl_mechanism
        opts["sasl_plain_username"] = cfg.sasl_username
        opts["sasl_plain_password"] = cfg.sasl_password.get_secret_value() if cfg.sasl_password else None
    return opts


async def _certificate_refused(servers: Sequence[str], ctx: ssl.SSLContext | None, timeout: float) -> str | None:
    """Why a bootstrap server's TLS certificate is refused, if it is (None: not TLS, or not that)."""
    if ctx is None:
        return None
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, int(port), ssl=ctx), timeout)
        except (OSError, ValueError, TimeoutError) as exc:
            reason = certificate_refused(exc)
            if reason is not None:
                return reason
            continue
        writer.close()
        return None  # the handshake works: the failure was something else
    return None


def encode(event: Event, mode: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value and headers of ``event`` in binary or structured mode."""
    if mode == "structured":
        return to_structured(event), [("content-type", STRUCTURED_CONTENT_TYPE.encode())]
    headers = [(k, v.encode()) for k, v in binary_headers(event, "ce_").items()]
    if event.content_type:
        headers.append(("content-type", event.content_type.encode()))
    return event.data, headers


class KafkaTransport(Transport):
    """See the module docstring."""

    name = "kafka"
    Config = KafkaConfig

    def __init__(self, config: KafkaConfig, *, destination: str = "kafka") -> None:
        super().__init__(config, destination=destination)
        self.cfg: KafkaConfig = config
        self._template = Template(
            config.topic, where=f"destinations.{destination}.topic", segment="name", alphabet=r"A-Za-z0-9._\-"
        )
        fields = {f for _, f, _, _ in string.Formatter().parse(config.topic) if f is not None}
        self._ordered = fields <= {"stream"}
        self._partitioner = DefaultPartitioner()
        self._partitions: dict[tuple[bytes, int], int] = {}
        self._producer: AIOKafkaProducer | None = None
        self._state = "new"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=self._ordered,
            native_dedupe=False,
            max_batch_count=1000,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary", "structured"),
            reader=True,
            subscriptions=True,
        )

    def target(self, event: Event) -> str:
        return self._template.render(event)

    async def open(self) -> None:
        if self._state == "open":
            return
        cfg = self.cfg
        options = client_options(cfg)
        with map_kafka_errors("connect to " + ",".join(cfg.servers), self.destination):
            producer = AIOKafkaProducer(
                **options,
                acks="all",
                enable_idempotence=cfg.enable_idempotence,
                linger_ms=cfg.linger_ms,
                max_batch_size=cfg.batch_bytes,
                max_request_size=cfg.batch_bytes + 4096,
                compression_type=None if cfg.compression == "none" else cfg.compression,
            )
            try:
                await asyncio.wait_for(producer.start(), cfg.connect_timeout)
            except BaseException as exc:
                await producer.stop()
                if cfg.enable_idempotence and isinstance(exc, ke.UnknownError | ke.UnsupportedVersionError):
                    # start() fetches an idempotent producer id; brokers without support fail exactly here
                    raise PermanentError(
                        f"kafka broker {','.join(cfg.servers)} refused an idempotent producer id ({describe(exc)}): "
                        "set enable_idempotence = false for brokers without idempotence support (e.g. tansu)",
                        destination=self.destination,
                    ) from exc
                if cfg.sasl_mechanism is not None and not isinstance(exc, ke.KafkaError | OSError | TimeoutError):
                    # aiokafka's SCRAM client fails with a bare KeyError/ValueError when the server
                    # refuses the credentials (its final message carries no verifier)
                    raise PermanentError(
                        f"kafka SASL {cfg.sasl_mechanism} authentication with {','.join(cfg.servers)} failed "
                        f"({type(exc).__name__}): check sasl_username/sasl_password and sasl_mechanism",
                        destination=self.destination,
                    ) from exc
                refused = await _certificate_refused(cfg.servers, options.get("ssl_context"), cfg.connect_timeout)
                if refused is not None:  # aiokafka only logs it and reports "Unable to bootstrap"
                    raise PermanentError(
                        f"kafka connect to {','.join(cfg.servers)}: {tls_hint(refused, 'ssl_cafile')}",
                        destination=self.destination,
                    ) from exc
                raise
        self._producer = producer
        self._state = "open"

    async def close(self) -> None:
        producer, self._producer = self._producer, None
        if self._state == "open":
            self._state = "closed"
        if producer is not None:
            with contextlib.suppress(Exception):  # closing: nothing useful to report to the caller
                await asyncio.wait_for(producer.stop(), self.cfg.request_timeout)

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        producer = self._producer
        if self._state != "open" or producer is None:
            raise UsageError(f"kafka transport {self.destination!r} is {self._state}, not open")
        partitions: dict[str, list[int] | BaseException] = {}
        for topic in {m.target for m in batch}:
            if not TOPIC_RE.match(topic):  # a rendered template may hold characters Kafka forbids
                partitions[topic] = PermanentError(
                    f"{topic!r} is not a valid Kafka topic name (letters, digits, '.', '_', '-'; at most 249)"
                )
                continue
            try:
                with map_kafka_errors(f"metadata for topic {topic!r}", self.destination):
                    parts = await asyncio.wait_for(producer.partitions_for(topic), self.cfg.request_timeout)
                partitions[topic] = sorted(parts)
            except Exception as exc:
                partitions[topic] = exc
        results: list[SendResult | None] = [None] * len(batch)
        failed: set[str] = set()
        # (topic, partition) -> list of (record batch, indices in it)
        chains: dict[tuple[str, int], list[tuple[Any, list[int]]]] = {}
        limit = self.cfg.max_message_bytes
        for i, m in enumerate(batch):
            parts = partitions[m.target]
            if m.key in failed:
                results[i] = RetryLater("held back: an earlier event of this stream failed in this batch")
                continue
            if len(m.event.data) > limit:
                results[i] = Rejected(f"message of {len(m.event.data)} bytes exceeds max_message_bytes={limit}")
                failed.add(m.key)
                continue
            if isinstance(parts, BaseException):
                results[i] = (Rejected if isinstance(parts, PermanentError) else RetryLater)(str(parts))
                failed.add(m.key)
                continue
            key = m.key.encode()
            partition = self._partition(key, parts)
            chain = chains.setdefault((m.target, partition), [])
            value, headers = encode(m.event, self.cfg.mode)
            timestamp = int(m.event.time.timestamp() * 1000)
            if not chain or chain[-1][0].append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
                builder = producer.create_batch()
                if builder.append(key=key, value=value, timestamp=timestamp, headers=headers) is None:
                    results[i] = Rejected("record does not fit into an empty record batch; raise batch_bytes")
                    failed.add(m.key)
                    continue
                chain.append((builder, []))
            chain[-1][1].append(i)
        await asyncio.gather(*(self._send_chain(producer, t, p, c, results) for (t, p), c in chains.items()))
        return [r if r is not None else RetryLater("no outcome recorded") for r in results]

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
        chain: list[tuple[Any, list[int]]],
        results: list[SendResult | None],
    ) -> None:
        """Send one partition's record batches in order; stop at the first failure."""
        for n, (builder, indices) in enumerate(chain):
            outcome: SendResult = Delivered()
            try:
                builder.close()
                fut = await producer.send_batch(builder, topic, partition=partition)
                fut.add_done_callback(_consume)
                # shield: on our timeout aiokafka keeps the batch and may still deliver it (at least once)
                await asyncio.wait_for(asyncio.shield(fut), self.cfg.request_timeout + 5)
            except TimeoutError:
                outcome = RetryLater(f"kafka produce to {topic}[{partition}] timed out")
            except Exception as exc:
                outcome = result_for(exc)
            for i in indices:
                results[i] = outcome
            if not isinstance(outcome, Delivered):
                for _, rest in chain[n + 1 :]:
                    for i in rest:
                        results[i] = RetryLater(_HELD)
                return

    async def check(self) -> str:
        """Reachability, and the topic's partitions when the template is static.

        Kafka cannot test WRITE permission without writing; an ACL problem
        shows up as a Rejected "TopicAuthorizationFailed" on the first send.
        """
        opened_here = self._state != "open"
        await self.open()
        assert self._producer is not None
        try:
            brokers = len(self._producer.client.cluster.brokers())
            head = f"kafka {','.join(self.cfg.servers)} reachable ({brokers} broker(s), acks=all, " + (
                f"idempotence {'on' if self.cfg.enable_idempotence else 'off'})"
            )
            if not self._template.is_static:
                return f"{head}; topics from template {self.cfg.topic!r} are resolved at publish"
            topic = self.cfg.topic
            try:
                parts = await asyncio.wait_for(self._producer.partitions_for(topic), self.cfg.connect_timeout)
            except Exception as exc:
                raise PermanentError(
                    f"kafka topic {topic!r} is not available ({describe(exc)}): create it "
                    f"(kafka-topics.sh --create --topic {topic}) or enable auto.create.topics.enable",
                    destination=self.destination,
                ) from exc
            return f"{head}; topic {topic!r} has {len(parts)} partition(s)"
        finally:
            if opened_here:
                await self.close()
                self._state = "new"

    def reader(self, target: str, **options: Any) -> Reader:
        """A consumer-group reader of ``target`` (options: ``group_id``, ``from_beginning``)."""
        from outrelay.transports.kafka._reader import KafkaReader

        return KafkaReader(self.cfg, target, **options)

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A consumer-group (or fan-out) backend for ``spec``; ``spec.target == ""`` means this
        destination's topic. :raises PermanentError: see :func:`~._subscriber.subscription_for`."""
        from outrelay.transports.kafka._subscriber import subscription_for

        return subscription_for(self.cfg, spec, destination=self.destination)
