"""Connecting to NATS: one quick first connect, then reconnecting for ever, without stale buffers or leaked sockets."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import nats
from nats.aio.client import Client

from outrelay.kit import PermanentError, RetryableError, certificate_refused, tls_hint
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._errors import classify, denied_subject, is_auth_error, mapped
from outrelay.transports.nats._sockets import close_failed_attempt, close_streams

__all__ = ["connect", "drop_unsent"]

log = logging.getLogger("outrelay.transports.nats")


async def connect(cfg: NatsConfig, destination: str, on_denied: Callable[[str], Any] | None = None) -> Client:
    """Connect once to the first reachable server, quickly; then reconnect forever.

    nats-py retries the *initial* connect until max_reconnect_attempts is used
    up, so connect with one attempt per server and widen it afterwards.
    ``on_denied(subject)`` is called when the server refuses a publish for lack
    of permission (it says so asynchronously, and no JetStream ack ever comes).
    Each failed connection attempt, whether the first connect or a reconnect,
    closes its socket. nats-py itself leaves open the socket of a reconnect whose
    handshake failed (see :mod:`~outrelay.transports.nats._sockets`).

    :raises RetryableError: no server reachable within the bounded time.
    :raises PermanentError: authorization failed, or the server's TLS certificate is not trusted.
    """

    auth_errors: list[Exception] = []  # the server's refusal is often followed by a connection reset
    refused: list[str] = []  # a TLS certificate we do not trust (nats-py only reports it here)
    holder: list[Client] = []
    close_bound = min(1.0, cfg.connect_timeout)  # to finish closing a failed attempt's socket, then abort it

    async def on_error(exc: Exception) -> None:
        subject = denied_subject(exc)
        if subject is not None and on_denied is not None:
            on_denied(subject)
        if is_auth_error(exc):
            auth_errors[:] = [exc]
        reason = certificate_refused(exc)
        if reason is not None:
            refused[:] = [reason]
        log.debug("destination %s: nats client error: %s", destination, classify(exc)[1])
        if holder:  # a failed reconnect attempt: close its socket before nats-py opens the next one
            await close_failed_attempt(holder[0], close_bound)

    opts = cfg.connect_options()
    opts.update(error_cb=on_error, allow_reconnect=True, max_reconnect_attempts=1)

    async def on_disconnect() -> None:
        if holder:
            drop_unsent(holder[0])

    bound = (cfg.connect_timeout + cfg.reconnect_time_wait) * 2 * len(cfg.servers) + 1.0
    with mapped(f"cannot connect to {cfg.where}", destination):
        try:
            nc = Client()
            holder.append(nc)
            try:
                await asyncio.wait_for(nc.connect(**opts, disconnected_cb=on_disconnect), timeout=bound)
            except BaseException:
                # past the bound, nats-py is cancelled mid-handshake with the socket still open
                await close_streams(nc, close_bound)
                raise
        except (nats.errors.NoServersError, TimeoutError) as exc:
            # the pool ran dry (or the bound passed); say why when the server refused us or we refused it
            if auth_errors:
                raise auth_errors[0] from exc
            if refused:
                hint = tls_hint(refused[0], "tls_ca_file")
                raise PermanentError(f"cannot connect to {cfg.where}: {hint}", destination=destination) from exc
            if isinstance(exc, TimeoutError):
                raise RetryableError(
                    f"cannot connect to {cfg.where}: no server answered within {bound:.0f}s", destination=destination
                ) from exc
            raise
    nc.options["max_reconnect_attempts"] = -1  # read on every reconnect attempt
    return nc


def drop_unsent(nc: Client) -> int:
    """Forget what nats-py buffered but did not write before a connection dropped.

    nats-py writes that buffer to the *next* connection, after messages that
    were on the lost one may have vanished: a later event could then be
    stored before an earlier one of its stream. Dropped messages get no ack,
    time out and are retried in order. Returns the number of bytes dropped.
    (Reaches into nats-py's private buffer; ``tests/transports/test_nats.py``
    fails if a nats-py release renames it.)
    """
    size = int(getattr(nc, "_pending_data_size", 0))
    if isinstance(getattr(nc, "_pending", None), list):
        nc._pending = []
        nc._pending_data_size = 0
    return size
