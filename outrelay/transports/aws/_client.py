"""The boto3 client of one service and the threads that run its calls.

boto3 is blocking, so every call runs in a bounded
:class:`~concurrent.futures.ThreadPoolExecutor` owned by the client
(``max_workers`` threads = at most that many API calls in flight); the one
boto3 client is thread-safe and reused. The relay's event loop never blocks:
the threads are all started by :meth:`AWSClient.start`, from a thread of
its own, because :class:`~concurrent.futures.ThreadPoolExecutor` otherwise
starts a thread inside ``submit`` — on the loop — and waits for it to run,
which on a loaded machine stalls the loop for tens of milliseconds.
Every failure of a call is mapped through :mod:`._errors` in :meth:`AWSClient.call`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import boto3
import botocore.config

from outrelay.kit import UsageError

from ._config import AWSConfig
from ._errors import service_error, to_error

__all__ = ["AWSClient"]

T = TypeVar("T")


def _start_threads(pool: ThreadPoolExecutor, n: int) -> None:
    """Make ``pool`` start its ``n`` threads now: ``n`` tasks that wait for each other keep every
    thread busy, so each submit starts a new one (a thread that does not come within 10 s only
    means the pool starts it later, on demand)."""
    barrier = threading.Barrier(n)

    def meet() -> None:
        with contextlib.suppress(threading.BrokenBarrierError):
            barrier.wait(10.0)

    for f in [pool.submit(meet) for _ in range(n)]:
        f.result()


class AWSClient:
    """A boto3 client for ``service`` plus the executor that runs its calls.

    ``start()`` creates both; ``stop()`` releases them and may be called at
    any time, twice, or after a failed ``start()``. A started client may be
    stopped and started again.
    """

    def __init__(self, service: str, config: AWSConfig, destination: str) -> None:
        self.service = service
        self.aws = config
        self.dest = destination
        self.client: Any = None
        self._pool: ThreadPoolExecutor | None = None

    @property
    def started(self) -> bool:
        return self._pool is not None

    def _make_client(self) -> Any:
        c = self.aws
        session = boto3.session.Session(
            aws_access_key_id=c.access_key_id,
            aws_secret_access_key=c.secret_access_key.get_secret_value() if c.secret_access_key else None,
            aws_session_token=c.session_token.get_secret_value() if c.session_token else None,
            region_name=c.region,
            profile_name=c.profile,
        )
        cfg = botocore.config.Config(
            connect_timeout=c.connect_timeout,
            read_timeout=c.read_timeout,
            retries={"total_max_attempts": c.sdk_max_attempts, "mode": "standard"},
            max_pool_connections=c.max_workers * 2,
        )
        return session.client(self.service, endpoint_url=c.endpoint_url, config=cfg)

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` in the executor; never blocks the loop.

        :raises UsageError: not started, or stopped meanwhile.
        :raises TransportError: the call failed (mapped by :func:`._errors.to_error`).
        """
        if self._pool is None:
            raise UsageError(f"{self.service} client of {self.dest!r} is not started")
        loop = asyncio.get_running_loop()
        try:
            future = loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))
        except RuntimeError as exc:  # the executor was shut down by stop() meanwhile
            raise UsageError(f"{self.service} client of {self.dest!r} is stopped") from exc
        try:
            return await future
        except Exception as exc:
            raise to_error(service_error(exc), what, self.dest) from exc

    async def start(self) -> None:
        """Create the executor and the client. :raises TransportError: see :meth:`call`."""
        if self._pool is not None:
            return
        n = self.aws.max_workers
        self._pool = pool = ThreadPoolExecutor(n, thread_name_prefix=f"outrelay-{self.service}")
        try:
            await asyncio.to_thread(_start_threads, pool, n)
            self.client = await self.call(f"{self.service} client setup", self._make_client)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        """Release the executor (without waiting for a slow HTTP call) and the client."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
