"""The nats transport's ``check``: a stream takes the subject, and the user may publish to it (nothing stored)."""

from __future__ import annotations

import asyncio
import uuid

import nats
from nats.aio.client import Client

from outrelay.kit import PermanentError, TransportError
from outrelay.transports.nats._config import (
    NatsConfig,
    atomic_not_allowed,
    derive_target,
    mask_url,
    publish_mode,
    stream_traits,
)
from outrelay.transports.nats._errors import ERRORS, PublishDenied, mapped

__all__ = ["check"]


async def check(cfg: NatsConfig, destination: str, nc: Client, probe: str, denied: list[str]) -> str:
    """Check ``probe`` (the subject rendered for a probe event) on the connected ``nc``; one line.

    ``denied`` collects the subjects the server refused (from ``connect``'s ``on_denied``).

    :raises RetryableError: no answer in time. :raises PermanentError: no stream covers the
        subject, it is not ``expected_stream``, or publishing is denied.
    """
    js = nc.jetstream(timeout=cfg.ack_timeout)
    spec = cfg.create_stream
    if spec is not None:  # what open() would do; check itself creates nothing
        try:
            with mapped(f"stream info {spec.name!r}", destination):
                await js.stream_info(spec.name)
        except TransportError:
            return (
                f"{cfg.where}: stream {spec.name!r} does not exist yet; the relay creates it at open "
                "(create_stream); check created nothing"
            )
    try:
        with mapped("stream lookup", destination):
            stream = await js.find_stream_name_by_subject(probe)
    except TransportError as exc:
        try:
            subjects = derive_target(cfg.subject, destination=destination)
        except PermanentError:
            subjects = probe
        raise PermanentError(
            f"no JetStream stream covers the subjects {subjects!r} on {cfg.where}: create one "
            f"(nats stream add --subjects '{subjects}') or set create_stream",
            destination=destination,
        ) from exc
    if cfg.expected_stream and stream != cfg.expected_stream:
        raise PermanentError(
            f"subject {probe!r} belongs to stream {stream!r}, not expected_stream "
            f"{cfg.expected_stream!r}: fix one of them",
            destination=destination,
        )
    with mapped(f"stream info {stream!r}", destination):
        info = await js.stream_info(stream)
    await _probe_publish(cfg, destination, nc, probe, denied)
    window = info.config.duplicate_window or 0
    replicas = info.config.num_replicas or 1
    traits = stream_traits(info.config)
    if cfg.atomic is True and not traits["allows_atomic"]:
        raise PermanentError(atomic_not_allowed(stream), destination=destination)
    mode = publish_mode(cfg, **traits)
    url = mask_url(nc.connected_url.geturl()) if nc.connected_url else cfg.where
    return (
        f"{url}: stream {stream!r} takes {probe!r} (dedupe window {window:g}s, {replicas} "
        f"{'replica' if replicas == 1 else 'replicas'}, {mode.describe()})"
    )


async def _probe_publish(cfg: NatsConfig, destination: str, nc: Client, subject: str, denied: list[str]) -> None:
    """Prove the user may publish to ``subject`` without storing anything: a
    publish whose ``Nats-Expected-Stream`` names no stream is refused by
    JetStream (an answer: permitted), while a denied publish gets the
    server's asynchronous permissions violation and no answer.

    :raises PermanentError: publishing is denied. :raises RetryableError: no answer in time.
    """
    headers = {"Nats-Expected-Stream": f"outrelay-check-probe-{uuid.uuid4().hex}"}
    try:
        await nc.request(subject, b"", timeout=cfg.ack_timeout, headers=headers)
    except (nats.errors.Error, TimeoutError) as exc:
        await asyncio.sleep(0)  # let a pending error callback run
        if not denied:
            raise ERRORS.error(exc, f"publish probe: subject {subject!r}", destination=destination) from None
    if denied:
        raise ERRORS.error(PublishDenied(subject), cfg.where, destination=destination)
