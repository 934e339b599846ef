"""Connections for the PostgreSQL outbox: URL options, a small pool, error
mapping, and the LISTEN thread (or event-loop reader) that wakes relays.

The URL is a libpq URI (``postgresql://user:pass@host:5432/db``) plus
outrelay's own query parameters, which are removed before connecting:
``schema`` (default ``public``), ``prefix`` (``outrelay_``), ``pool_size``
(4), ``notify`` (``true``) and ``migrate`` (``true``). Passwords never
appear in reprs or error messages (:func:`redact`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import orjson
import psycopg
from psycopg.types.json import set_json_loads

from outrelay.core.model.errors import ConfigError, StoreError
from outrelay.core.stores.base import InlineRefused, running_inline

__all__ = ["ConnectionPool", "Listener", "LoopListener", "parse_url", "redact"]

log = logging.getLogger("outrelay.store.postgres")

OWN_PARAMS = ("schema", "prefix", "pool_size", "notify", "migrate")


def redact(url: str) -> str:
    """``url`` without its password (for reprs, logs and errors)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _bool(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"outbox url option {name}={value!r}: use true or false")


def parse_url(url: str, overrides: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Split ``url`` into a libpq conninfo and outrelay's options
    (``overrides``, the keyword arguments of ``Outbox.open``, win).

    :raises ConfigError: not a postgresql:// URL, or a bad option value.
    """
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0].lower()
    if scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"outbox url {redact(url)!r} is not postgresql://USER@HOST/DB")
    query = parse_qsl(parts.query, keep_blank_values=True)
    own = {k: v for k, v in query if k in OWN_PARAMS}
    rest = [(k, v) for k, v in query if k not in OWN_PARAMS]
    if not any(k == "connect_timeout" for k, _ in rest):
        rest.append(("connect_timeout", "5"))
    unknown = set(overrides) - set(OWN_PARAMS)
    if unknown:
        raise ConfigError(f"unknown PostgreSQL outbox option(s) {sorted(unknown)}; known: {', '.join(OWN_PARAMS)}")
    own.update({k: v for k, v in overrides.items() if v is not None})
    try:
        pool_size = int(own.get("pool_size", 4))
    except ValueError:
        raise ConfigError(f"outbox url option pool_size={own['pool_size']!r}: give a whole number") from None
    if not 1 <= pool_size <= 64:
        raise ConfigError(f"outbox url option pool_size={pool_size}: give 1 to 64")
    options = {
        "schema": str(own.get("schema", "public")),
        "prefix": str(own.get("prefix", "outrelay_")),
        "pool_size": pool_size,
        "notify": _bool("notify", own.get("notify", True)),
        "migrate": _bool("migrate", own.get("migrate", True)),
    }
    conninfo = urlunsplit(("postgresql", parts.netloc, parts.path, urlencode(rest), parts.fragment))
    return conninfo, options


def connect(conninfo: str, where: str) -> psycopg.Connection[Any]:
    """An autocommit connection that decodes jsonb with orjson.

    :raises StoreError: cannot connect (bounded by ``connect_timeout``).
    """
    try:
        conn = psycopg.connect(conninfo, autocommit=True)
    except psycopg.Error as exc:
        raise StoreError(f"cannot connect to the PostgreSQL outbox {where}: {_first_line(exc)}") from None
    set_json_loads(orjson.loads, conn)
    return conn


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


class ConnectionPool:
    """At most ``size`` autocommit connections, reused LIFO; a broken one is
    dropped and replaced on the next checkout."""

    def __init__(self, conninfo: str, size: int, where: str) -> None:
        self._conninfo = conninfo
        self._where = where
        self._size = size
        self._idle: queue.LifoQueue[psycopg.Connection[Any]] = queue.LifoQueue()
        self._all: set[psycopg.Connection[Any]] = set()
        self._lock = threading.Lock()
        self._slots = threading.BoundedSemaphore(size)
        self.closed = False
        #: server process ids of this pool's connections (the sender of a NOTIFY one of them made)
        self.pids: set[int] = set()

    @contextmanager
    def connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A connection, for the ``with`` block; given back (or dropped if broken) after it.

        :raises StoreError: the pool is closed, or a new connection cannot be made.
        :raises InlineRefused: in a thread running an inline call (``PostgresStore.call_inline``: see
            :func:`~outrelay.core.stores.base.running_inline`), where it would have waited for a free
            slot or for a new connection."""
        if self.closed:
            raise StoreError(f"the PostgreSQL outbox {self._where} is closed")
        wait = not running_inline()
        if not self._slots.acquire(blocking=wait):
            raise InlineRefused("every connection of the pool is in use")
        try:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                if not wait:
                    raise InlineRefused("no idle connection (connecting would wait)") from None
                conn = connect(self._conninfo, self._where)
                with self._lock:
                    self._all.add(conn)
                    self.pids.add(conn.info.backend_pid)
            try:
                yield conn
            finally:
                idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
                if conn.closed or conn.broken or not idle or self.closed:
                    self._discard(conn)
                else:
                    self._idle.put(conn)
        finally:
            self._slots.release()

    def _discard(self, conn: psycopg.Connection[Any]) -> None:
        with self._lock:
            self._all.discard(conn)
            with suppress(psycopg.Error):  # closed: its pid is no longer known
                self.pids.discard(conn.info.backend_pid)
        with suppress(psycopg.Error):  # already gone
            conn.close()

    def close(self) -> None:
        self.closed = True
        with self._lock:
            conns = list(self._all)
            self._all.clear()
        for conn in conns:
            with suppress(psycopg.Error):
                conn.close()


class Listener:
    """A daemon thread that LISTENs on ``channel`` and calls ``callback(payload, pid)``
    for each notification (``pid``: the sending server process); reconnects with
    backoff (polling covers the gaps).

    :meth:`stop` shuts the LISTEN connection's socket down, so the thread
    leaves its wait at once instead of at the end of a poll interval (a relay
    that stops, ``run --drain`` included, does not wait it out)."""

    def __init__(self, conninfo: str, channel: str, callback: Callable[[str, int], None], where: str) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._callback = callback
        self._where = where
        self._stop = threading.Event()
        self._lock = threading.Lock()  # guards _conn: stop() never touches the socket of a closed connection
        self._conn: psycopg.Connection[Any] | None = None
        self._thread = threading.Thread(target=self._run, name="outrelay-pg-listen", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        delay = 0.5
        while not self._stop.is_set():
            try:
                conn = psycopg.connect(self._conninfo, autocommit=True)
            except psycopg.Error as exc:
                log.warning("LISTEN on %s failed: %s (polling meanwhile)", self._where, _first_line(exc))
                self._stop.wait(delay)
                delay = min(delay * 2, 30.0)
                continue
            delay = 0.5
            with self._lock:
                self._conn = conn
            try:
                if self._stop.is_set():  # stop() came before the connection was published
                    return
                conn.execute(f'LISTEN "{self._channel}"')
                while not self._stop.is_set():
                    for note in conn.notifies(timeout=_POLL):
                        try:
                            self._callback(note.payload, note.pid)
                        except Exception:  # a wake-up is a hint: never let it kill the listener
                            log.debug("LISTEN callback failed", exc_info=True)
            except (psycopg.Error, OSError) as exc:
                if not self._stop.is_set():
                    log.warning("LISTEN connection to %s lost: %s (reconnecting)", self._where, _first_line(exc))
            finally:
                with self._lock:
                    self._conn = None
                    conn.close()

    def stop(self) -> None:
        """Stop the thread and close its connection; returns at once (within 5 s at worst)."""
        self._stop.set()
        with self._lock:
            conn = self._conn
            if conn is not None and not conn.closed:
                with suppress(OSError, psycopg.Error):
                    # the socket, not the descriptor: the thread's wait sees the end of the stream
                    sock = socket.socket(fileno=os.dup(conn.fileno()))
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    finally:
                        sock.close()
        self._thread.join(timeout=5)


#: seconds the LISTEN thread waits for notifications before checking its stop flag again
_POLL = 0.5


class LoopListener:
    """:class:`Listener` in an event loop instead of a thread: the LISTEN connection's socket is a
    reader of ``loop``, and ``callback(payload, pid)`` is called in the loop's thread as the
    notifications arrive (no thread to wake, no hand-off to the loop per append). Connecting and
    ``LISTEN`` run in the loop's default executor; a lost connection is made again with backoff
    (polling covers the gaps). :meth:`stop` (in the loop's thread) ends it at once."""

    def __init__(
        self,
        conninfo: str,
        channel: str,
        callback: Callable[[str, int], None],
        where: str,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        self._conninfo = conninfo
        self._channel = channel
        self._callback = callback
        self._where = where
        self._loop = loop
        self._stopped = False
        self._conn: psycopg.Connection[Any] | None = None
        self._lost: asyncio.Future[None] | None = None
        self._connecting: asyncio.Future[psycopg.Connection[Any]] | None = None
        self._task = loop.create_task(self._run())

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self._conninfo, autocommit=True)
        try:
            conn.execute(f'LISTEN "{self._channel}"')
        except BaseException:
            conn.close()
            raise
        return conn

    async def _run(self) -> None:
        delay = 0.5
        while not self._stopped:
            self._connecting = connecting = self._loop.run_in_executor(None, self._connect)
            connecting.add_done_callback(self._close_unwanted)
            try:
                conn = await asyncio.shield(connecting)  # stop() cancels this wait, not the connect
            except (psycopg.Error, OSError) as exc:
                self._connecting = None
                log.warning("LISTEN on %s failed: %s (polling meanwhile)", self._where, _first_line(exc))
                await asyncio.sleep(delay)
                delay = min(delay * 2, 30.0)
                continue
            delay = 0.5
            self._conn, self._lost, self._connecting = conn, self._loop.create_future(), None
            fd = conn.fileno()
            self._loop.add_reader(fd, self._readable)
            try:
                await self._lost
            finally:
                if self._conn is conn:  # else stop() closed it
                    self._loop.remove_reader(fd)
                    self._conn = None
                    conn.close()
            log.warning("LISTEN connection to %s lost (reconnecting)", self._where)

    def _readable(self) -> None:
        conn, lost = self._conn, self._lost
        if conn is None or lost is None or lost.done():
            return
        try:
            conn.pgconn.consume_input()  # never blocks; fails when the server closed the connection
            while (note := conn.pgconn.notifies()) is not None:
                try:
                    self._callback(note.extra.decode(), note.be_pid)
                except Exception:  # a wake-up is a hint: never let it end the listener
                    log.debug("LISTEN callback failed", exc_info=True)
        except (psycopg.Error, OSError):
            lost.set_result(None)

    def _close_unwanted(self, connecting: asyncio.Future[psycopg.Connection[Any]]) -> None:
        """A connection made for a listener stopped meanwhile is closed (as it comes, or at the stop)."""
        if self._stopped and not connecting.cancelled() and connecting.exception() is None:
            connecting.result().close()

    def stop(self) -> None:
        """Stop listening and close the connection (in the loop's thread; returns at once; idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        conn, self._conn = self._conn, None
        if conn is not None:
            self._loop.remove_reader(conn.fileno())
            conn.close()
        if self._connecting is not None and self._connecting.done():  # made, not taken yet
            self._close_unwanted(self._connecting)
        if not self._loop.is_closed():
            self._task.cancel()
