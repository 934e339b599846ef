"""Building the ``pulsar-client`` objects of the ``pulsar`` transport, and bridging its threads to asyncio.

The client is blocking (producer creation, flush, close, receive) and calls
back from its own I/O thread (``send_async``). :class:`Blocking` runs the
blocking calls in a small thread pool, each bounded, so the event loop never
blocks and a down broker fails with :class:`~outrelay.kit.RetryableError`
after the bound; :class:`Acks` gathers one batch's ``send_async`` callbacks
and wakes the loop once, when the last one arrived.

The C++ client logs to the console at ``client_log_level`` (default
``warn``); ``debug`` routes every line into the ``outrelay.transports.pulsar``
logger instead, at about half the throughput (the client calls Python for
each of its per-message debug lines).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import pulsar

from outrelay.kit import RetryableError
from outrelay.transports.pulsar._config import PulsarConfig
from outrelay.transports.pulsar._errors import ERRORS

__all__ = ["Acks", "Blocking", "make_client", "producer_options"]

T = TypeVar("T")

log = logging.getLogger("outrelay.transports.pulsar")


def make_client(cfg: PulsarConfig) -> Any:
    """A ``pulsar.Client`` for ``cfg`` (it connects lazily, at the first producer or consumer)."""
    auth = pulsar.AuthenticationToken(cfg.token.get_secret_value()) if cfg.token else None
    return pulsar.Client(
        cfg.service_url,
        authentication=auth,
        operation_timeout_seconds=max(1, int(cfg.operation_timeout)),
        connection_timeout_ms=int(cfg.connect_timeout * 1000),
        tls_trust_certs_file_path=cfg.tls_trust_certs_file_path,
        tls_allow_insecure_connection=cfg.tls_allow_insecure_connection,
        tls_validate_hostname=cfg.tls_validate_hostname,
        logger=_client_logger(cfg),
    )


def _client_logger(cfg: PulsarConfig) -> Any:
    # The C++ client calls a Python logger for every DEBUG line (two per message), taking the GIL from its
    # I/O thread each time and halving throughput; only route into `logging` when asked to.
    if cfg.client_log_level == "debug":
        return log
    return pulsar.ConsoleLogger(getattr(pulsar.LoggerLevel, cfg.client_log_level.capitalize()))


def producer_options(cfg: PulsarConfig, destination: str, *, named: bool) -> dict[str, Any]:
    """``create_producer`` keyword arguments; a ``named`` producer (deduplication) is stable across restarts."""
    options: dict[str, Any] = {
        "send_timeout_millis": int(cfg.send_timeout * 1000),
        "batching_enabled": cfg.batching,
        "batching_max_messages": cfg.batching_max_messages,
        "batching_max_publish_delay_ms": cfg.batching_max_publish_delay_ms,
        "max_pending_messages": cfg.max_pending_messages,
        "block_if_queue_full": False,
    }
    if named:
        options["producer_name"] = cfg.producer_name or f"outrelay-{destination}"
    return options


class Blocking:
    """A small thread pool for the client's blocking calls, each given up (retryably) after ``bound`` seconds."""

    def __init__(self, workers: int, *, bound: float, destination: str, name: str = "outrelay-pulsar") -> None:
        self.bound = bound
        self.destination = destination
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix=name)

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the pool.

        :raises RetryableError: no answer within ``bound`` seconds, or a transient client error.
        :raises PermanentError: what :data:`~._errors.ERRORS` classifies so (refused credentials, a bad topic).
        """

        def run() -> T:
            with ERRORS.boundary(what, destination=self.destination):
                return fn(*args, **kwargs)

        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.bound):
                return await loop.run_in_executor(self._pool, run)
        except TimeoutError:
            raise RetryableError(f"{what}: no answer within {self.bound:.0f} s", destination=self.destination) from None

    def shutdown(self) -> None:
        """Stop the pool without waiting for a call still blocked in the client."""
        self._pool.shutdown(wait=False, cancel_futures=True)


class Acks:
    """Collects ``send_async`` callbacks (client I/O thread) for one batch and
    wakes the event loop once, when the last one arrived, instead of once per
    message. ``results[i]`` is the ``pulsar.Result`` of message ``i`` once it
    arrived (None before)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, n: int) -> None:
        self.loop = loop
        self.results: list[Any] = [None] * n
        self.remaining = n
        self.lock = threading.Lock()
        self.future: asyncio.Future[list[Any]] = loop.create_future()
        if n == 0:
            self.future.set_result(self.results)

    def done(self, index: int, result: Any, _msg_id: Any) -> None:
        self.results[index] = result
        with self.lock:
            self.remaining -= 1
            last = self.remaining == 0
        if last:
            self.loop.call_soon_threadsafe(self._finish)

    def _finish(self) -> None:
        if not self.future.done():
            self.future.set_result(self.results)

    async def wait(self) -> list[Any]:
        return await self.future
