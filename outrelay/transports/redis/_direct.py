"""One Lua script called by ``EVALSHA`` on connections of its own: the relay's sends at a trickle.

redis-py's ``Script.__call__`` goes through ``execute_command``: the pool's lock, a
readiness probe of the socket (a system call), the retry wrapper and its
bookkeeping, per call. A one-event send of the transport took 529,000 instructions
that way and 409,000 with the same ``EVALSHA`` written and read on a connection
kept aside (callgrind, 300 sends at a trickle; ``benchmarks/README.md``).
:class:`DirectScript` keeps the connections it used (one per concurrent call,
taken from the client's pool once) and writes and reads on them directly: the
write also skips redis-py's ``wait_for`` under ``socket_timeout`` (a task, a
timer and an event-loop round per call); the read keeps its timeout.

What the pool's probe did is kept where it matters: a connection idle for more
than :data:`PROBE_AFTER` seconds is probed before use (the server may have
closed it meanwhile; it is then reconnected; one closed sooner fails that send, a
retryable error, and the relay sends again), one that failed with anything but
an error reply is disconnected and given back to the pool (its state is
unknown: a timeout or a cancellation may leave a reply unread), and a
``NOSCRIPT`` reply (the server restarted or flushed its scripts) loads the
script and calls it again once. Errors propagate as redis-py raises them, so
the transport maps them as before.
"""

from __future__ import annotations

import contextlib
import hashlib
import time
from typing import Any

import redis.asyncio as aioredis
from redis.asyncio.connection import AbstractConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, RedisError, ResponseError

__all__ = ["PROBE_AFTER", "DirectScript"]

#: seconds a kept connection may sit idle before it is probed (like the pool does each time) before use
PROBE_AFTER = 1.0


class DirectScript:
    """``await script(keys=[...], args=[...])``: the reply of ``EVALSHA`` of ``text`` (see the module
    docstring). :meth:`close` gives the kept connections back to the client's pool."""

    def __init__(self, client: aioredis.Redis, text: str) -> None:
        self._client = client
        self._text = text
        self.sha = hashlib.sha1(text.encode()).hexdigest()
        self._idle: list[tuple[AbstractConnection, float]] = []  # kept connections, when last used

    async def __call__(self, *, keys: list[Any], args: list[Any]) -> Any:
        conn = await self._take()
        healthy = False
        try:
            try:
                reply = await self._call(conn, keys, args)
            except NoScriptError:
                await conn.send_command("SCRIPT", "LOAD", self._text, check_health=False)
                await conn.read_response()
                reply = await self._call(conn, keys, args)
            healthy = True
            return reply
        except ResponseError:  # an error reply: the connection is in step
            healthy = True
            raise
        finally:
            if healthy:
                self._idle.append((conn, time.monotonic()))
            else:
                await self._drop(conn)

    async def _call(self, conn: AbstractConnection, keys: list[Any], args: list[Any]) -> Any:
        packed = conn.pack_command("EVALSHA", self.sha, len(keys), *keys, *args)
        write = getattr(conn, "_send_packed_command", None)
        if write is None or not conn.is_connected:  # connects first (or a redis-py without the method)
            await conn.send_packed_command(packed, check_health=False)
        else:
            # the write without redis-py's ``wait_for(..., socket_timeout)``: a task, a timer and a loop
            # round per call; writing never blocks here (only ``drain`` under back-pressure, which the
            # relay's attempt_timeout bounds), and a failed write drops the connection (see __call__)
            try:
                await write(packed)
            except OSError as exc:
                raise RedisConnectionError(f"Error while writing to the socket: {exc}") from exc
        return await conn.read_response()

    async def _take(self) -> AbstractConnection:
        """A kept connection (probed if idle for long), else one from the pool."""
        while self._idle:
            conn, used = self._idle.pop()
            if time.monotonic() - used <= PROBE_AFTER:
                return conn
            try:
                # can_read (redis-py 8+; can_read_destructive before): True when data is waiting, an error
                # when the server closed the connection
                probe = getattr(conn, "can_read", None) or conn.can_read_destructive
                if not await probe():
                    return conn
            except (OSError, RedisError):  # closed by the server, or unreadable
                pass
            await self._drop(conn)
        fresh: AbstractConnection = await self._client.connection_pool.get_connection()  # type: ignore[no-untyped-call]
        return fresh

    async def _drop(self, conn: AbstractConnection) -> None:
        with contextlib.suppress(Exception):  # a broken connection: the next call takes another one
            await conn.disconnect()
        with contextlib.suppress(Exception):
            await self._client.connection_pool.release(conn)

    async def close(self) -> None:
        """Give the kept connections back to the pool (the client's ``aclose`` closes them)."""
        idle, self._idle = self._idle, []
        for conn, _ in idle:
            with contextlib.suppress(Exception):
                await self._client.connection_pool.release(conn)
