"""Building and connecting the aiokafka clients of the ``kafka`` transport.

:func:`client_options` gives the connection and security arguments that the
producer (:func:`start_producer`), the reader and the subscription share;
:func:`partitions` and :func:`seek_all` resolve a consumer's positions
before anything is read, so nothing published afterwards is missed.

:raises PermanentError: from :func:`start_producer` when the TLS files cannot
    be loaded (a wrong ``ssl_password``...), the broker refuses the SASL login
    or an idempotent producer, or the server's certificate is refused; one
    line saying what to fix, never a secret.
:raises RetryableError: from :func:`start_producer` when no broker answers
    within ``connect_timeout`` (never hangs); the message names the servers.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka import errors as ke

from outrelay.kit import PermanentError, certificate_refused, client_ssl_context, tls_hint
from outrelay.transports.kafka._config import KafkaConfig
from outrelay.transports.kafka._errors import ERRORS, describe

__all__ = ["client_options", "partitions", "seek_all", "start_producer"]


def client_options(cfg: KafkaConfig) -> dict[str, Any]:
    """Connection and security keyword arguments shared by producer and consumers.

    :raises PermanentError: the TLS files cannot be loaded (see :func:`~outrelay.kit.client_ssl_context`).
    """
    opts: dict[str, Any] = {
        "bootstrap_servers": cfg.servers,
        "client_id": cfg.client_id,
        "request_timeout_ms": int(cfg.request_timeout * 1000),
        "security_protocol": cfg.security_protocol,
    }
    if cfg.security_protocol in ("SSL", "SASL_SSL"):
        opts["ssl_context"] = client_ssl_context(
            ca_file=cfg.ssl_cafile,
            cert_file=cfg.ssl_certfile,
            key_file=cfg.ssl_keyfile,
            key_password=cfg.ssl_password.get_secret_value() if cfg.ssl_password else None,
            check_hostname=cfg.ssl_check_hostname,
            options="ssl_cafile, ssl_certfile and ssl_keyfile, and ssl_password",
        )
    if cfg.sasl_mechanism is not None:
        opts["sasl_mechanism"] = cfg.sasl_mechanism
        opts["sasl_plain_username"] = cfg.sasl_username
        opts["sasl_plain_password"] = cfg.sasl_password.get_secret_value() if cfg.sasl_password else None
    return opts


async def start_producer(cfg: KafkaConfig, destination: str) -> AIOKafkaProducer:
    """A started ``acks=all`` producer for ``cfg`` (see the module docstring for what raises)."""
    options = client_options(cfg)
    servers = ",".join(cfg.servers)
    with ERRORS.boundary(f"kafka connect to {servers}", destination=destination):
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
            async with asyncio.timeout(cfg.connect_timeout):
                await producer.start()
        except Exception as exc:
            await producer.stop()
            refusal = await _refusal(cfg, options.get("ssl_context"), exc)
            if refusal is not None:
                raise PermanentError(f"kafka connect to {servers}: {refusal}", destination=destination) from exc
            raise
        except BaseException:
            await producer.stop()
            raise
    return producer


async def _refusal(cfg: KafkaConfig, ctx: ssl.SSLContext | None, exc: Exception) -> str | None:
    """What to fix when the broker refused the producer itself, not just failed to answer (None: it did not)."""
    if cfg.enable_idempotence and isinstance(exc, ke.UnknownError | ke.UnsupportedVersionError):
        # start() fetches an idempotent producer id; brokers without support fail exactly here
        return (
            f"the broker refused an idempotent producer id ({describe(exc)}): set enable_idempotence = false "
            "for brokers without idempotence support (e.g. tansu)"
        )
    if cfg.sasl_mechanism is not None and not isinstance(exc, ke.KafkaError | OSError | TimeoutError):
        # aiokafka's SCRAM client fails with a bare KeyError/ValueError when the server
        # refuses the credentials (its final message carries no verifier)
        return (
            f"SASL {cfg.sasl_mechanism} authentication with {','.join(cfg.servers)} failed ({type(exc).__name__}): "
            "check sasl_username/sasl_password and sasl_mechanism"
        )
    refused = await _certificate_refused(cfg.servers, ctx, cfg.connect_timeout)
    if refused is not None:  # aiokafka only logs it and reports "Unable to bootstrap"
        return tls_hint(refused, "ssl_cafile")
    return None


async def _certificate_refused(servers: Sequence[str], ctx: ssl.SSLContext | None, timeout: float) -> str | None:
    """Why a bootstrap server's TLS certificate is refused, if it is (None: not TLS, or not that)."""
    if ctx is None:
        return None
    for server in servers:
        host, _, port = server.rpartition(":")
        try:
            async with asyncio.timeout(timeout):
                _, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
        except (OSError, ValueError, TimeoutError) as exc:
            reason = certificate_refused(exc)
            if reason is not None:
                return reason
            continue
        writer.close()
        return None  # the handshake works: the failure was something else
    return None


async def partitions(consumer: AIOKafkaConsumer, topic: str, timeout: float) -> list[int]:
    """The partitions of ``topic``, sorted; waiting for its metadata auto-creates it where the broker allows.

    :raises TimeoutError: no metadata within ``timeout`` seconds.
    """
    async with asyncio.timeout(timeout):
        # the producer's metadata wait (public there as partitions_for)
        parts = await consumer._client._wait_on_metadata(topic)
    return sorted(parts)


async def seek_all(
    consumer: AIOKafkaConsumer, assigned: Sequence[TopicPartition], *, from_beginning: bool, to_end: bool
) -> None:
    """Position ``consumer`` on ``assigned``: at the beginning, at the end (``to_end``), or where its group
    committed; the positions are resolved now, not at the first read."""
    if from_beginning:
        await consumer.seek_to_beginning(*assigned)
    elif to_end:
        await consumer.seek_to_end(*assigned)
    for tp in assigned:
        await consumer.position(tp)
