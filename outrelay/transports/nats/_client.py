"""Building the NATS client: one quick first connect, then reconnecting for ever, without stale
buffers or leaked sockets; and ``create_stream`` (the transport at open, the subscriptions at start).

The transport, the reader, the check and the subscriptions all connect through :func:`connect`;
it imports nothing of this package but ``_config``, ``_errors`` and ``_sockets`` (no cycle).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import nats
import nats.js.api
import nats.js.errors
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from outrelay.kit import PermanentError, RetryableError, certificate_refused, tls_hint
from outrelay.transports.nats._config import NatsConfig, StreamSpec
from outrelay.transports.nats._errors import classify, denied_subject, is_auth_error, mapped
from outrelay.transports.nats._sockets import close_failed_attempt, close_streams

__all__ = ["Callbacks", "close_quietly", "connect", "drop_unsent", "ensure_stream"]

log = logging.getLogger("outrelay.transports.nats")


class Callbacks:
    """What the connection tells its owner; every one optional.

    * ``on_denied(subject)``: the server refused a publish for lack of permission (it says so
      asynchronously, and no JetStream ack ever comes);
    * ``on_lost(reason)``: the connection dropped and the client is reconnecting (what it had
      buffered and not written is dropped first: :func:`drop_unsent`);
    * ``on_restored()``: reconnected;
    * ``on_closed(client)``: ``client`` closed for good (it gave up reconnecting, or was closed
      by someone, its owner included); not called for a connection that never opened.
    """

    __slots__ = ("on_closed", "on_denied", "on_lost", "on_restored")

    def __init__(
        self,
        *,
        on_denied: Callable[[str], Any] | None = None,
        on_lost: Callable[[str], Any] | None = None,
        on_restored: Callable[[], Any] | None = None,
        on_closed: Callable[[Client], Any] | None = None,
    ) -> None:
        self.on_denied, self.on_lost, self.on_restored, self.on_closed = on_denied, on_lost, on_restored, on_closed


class _Attempt:
    """The state of one :func:`connect` call that nats-py's callbacks feed."""

    def __init__(self, cfg: NatsConfig, destination: str, callbacks: Callbacks) -> None:
        self.cfg, self.destination, self.callbacks = cfg, destination, callbacks
        self.nc = Client()
        self.auth_errors: list[Exception] = []  # the server's refusal is often followed by a connection reset
        self.refused: list[str] = []  # a TLS certificate we do not trust (nats-py only reports it here)
        self.connected = False
        self.close_bound = min(1.0, cfg.connect_timeout)  # to finish closing a failed attempt's socket

    async def on_error(self, exc: Exception) -> None:
        subject = denied_subject(exc)
        if subject is not None and self.callbacks.on_denied is not None:
            self.callbacks.on_denied(subject)
        if is_auth_error(exc):
            self.auth_errors[:] = [exc]
        reason = certificate_refused(exc)
        if reason is not None:
            self.refused[:] = [reason]
        log.debug("destination %s: nats client error: %s", self.destination, classify(exc)[1])
        # a failed reconnect attempt: close its socket before nats-py opens the next one
        await close_failed_attempt(self.nc, self.close_bound)

    async def on_disconnect(self) -> None:
        drop_unsent(self.nc)
        if self.connected and self.callbacks.on_lost is not None:
            self.callbacks.on_lost(f"disconnected from {self.cfg.where}")

    async def on_reconnect(self) -> None:
        if self.callbacks.on_restored is not None:
            self.callbacks.on_restored()

    async def on_close(self) -> None:
        if self.connected and self.callbacks.on_closed is not None:
            self.callbacks.on_closed(self.nc)

    def options(self) -> dict[str, Any]:
        opts = self.cfg.connect_options()
        opts.update(
            error_cb=self.on_error,
            disconnected_cb=self.on_disconnect,
            reconnected_cb=self.on_reconnect,
            closed_cb=self.on_close,
            allow_reconnect=True,
            max_reconnect_attempts=1,
        )
        return opts

    def why_not(self, exc: BaseException, bound: float) -> BaseException:
        """What to raise when the first connect failed with ``exc``: the server's refusal or ours."""
        if self.auth_errors:
            return self.auth_errors[0]
        if self.refused:
            hint = tls_hint(self.refused[0], "tls_ca_file")
            return PermanentError(f"cannot connect to {self.cfg.where}: {hint}", destination=self.destination)
        if isinstance(exc, TimeoutError):
            return RetryableError(
                f"cannot connect to {self.cfg.where}: no server answered within {bound:.0f}s",
                destination=self.destination,
            )
        return exc


async def connect(cfg: NatsConfig, destination: str, callbacks: Callbacks | None = None) -> Client:
    """Connect once to the first reachable server, quickly; then reconnect forever.

    nats-py retries the *initial* connect until max_reconnect_attempts is used
    up, so connect with one attempt per server and widen it afterwards. Each
    failed connection attempt, whether the first connect or a reconnect,
    closes its socket. nats-py itself leaves open the socket of a reconnect whose
    handshake failed (see :mod:`~outrelay.transports.nats._sockets`).
    ``callbacks``: see :class:`Callbacks`.

    :raises RetryableError: no server reachable within the bounded time.
    :raises PermanentError: authorization failed, or the server's TLS certificate is not trusted.
    """
    attempt = _Attempt(cfg, destination, callbacks or Callbacks())
    nc = attempt.nc
    bound = (cfg.connect_timeout + cfg.reconnect_time_wait) * 2 * len(cfg.servers) + 1.0
    with mapped(f"cannot connect to {cfg.where}", destination):
        try:
            try:
                await asyncio.wait_for(nc.connect(**attempt.options()), timeout=bound)
            except BaseException:
                # past the bound, nats-py is cancelled mid-handshake with the socket still open
                await close_streams(nc, attempt.close_bound)
                raise
        except (nats.errors.NoServersError, TimeoutError) as exc:
            # the pool ran dry (or the bound passed); say why when the server refused us or we refused it
            raise attempt.why_not(exc, bound) from exc
    attempt.connected = True
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


async def ensure_stream(js: JetStreamContext, spec: StreamSpec, destination: str) -> None:
    """Create the ``create_stream`` stream unless it exists (its configuration is not compared).

    :raises RetryableError/PermanentError: the server could not tell or refused (by ``_errors``).
    """
    config = nats.js.api.StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        storage=nats.js.api.StorageType(spec.storage),
        duplicate_window=spec.duplicate_window,
        num_replicas=spec.replicas,
        allow_atomic=spec.allow_atomic or None,  # unset on servers before 2.12, which do not know it
    )
    with mapped(f"cannot create stream {spec.name!r}", destination):
        try:
            await js.stream_info(spec.name)
        except nats.js.errors.NotFoundError:
            await js.add_stream(config)


async def close_quietly(nc: Client | None, destination: str) -> None:
    """Close ``nc`` unless it is closed already; a failure to close is logged at debug level."""
    if nc is None or nc.is_closed:
        return
    try:
        await nc.close()
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        log.debug("destination %s: close: %s", destination, classify(exc)[1])
