"""The webhook hot path: a small HTTP/1.1 client on an asyncio protocol, with a keep-alive pool.

Why not httpx here: through httpx → httpcore → anyio one signed POST cost
the relay about 1 ms of CPU; this client costs a few tens of µs, well under
a raw aiohttp client (``benchmarks/bench_webhook.py`` prints both). httpx
still provides the TLS context (:func:`httpx.create_ssl_context`, certifi).

Scope, deliberately small: one request at a time per connection (no
pipelining), HTTP/1.1 only, no redirects (a 3xx is returned like any
answer), no proxies, no cookies, no ``Accept-Encoding`` (answers come
uncompressed). How an answer is framed and when a connection may be
reused: :mod:`._connection`. At most ``body_limit`` bytes of a body are
kept; a longer answer drops the connection instead of being downloaded.

The caller bounds the whole attempt (connect, send, every byte of the
answer) with one ``asyncio.timeout``; any exception, cancellation
included, aborts the connection instead of returning it to the pool.

:raises OSError: connect, reset, TLS failures. :raises ProtocolError: a
malformed answer or one cut short. :raises PrivateAddressRefused: the SSRF
guard refused every address. :raises InvalidRequest: an unusable URL or a
header that cannot go on the wire (both permanent).
"""

from __future__ import annotations

import base64
import functools
import ssl
import time
from collections.abc import Callable
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from outrelay.transports.webhook._connection import Connection, Origin, ProtocolError, Response
from outrelay.transports.webhook._ssrf import AddressGuard

__all__ = [
    "ConnectionPool",
    "InvalidRequest",
    "Origin",
    "ProtocolError",
    "Response",
    "Target",
    "parse_target",
    "safe_url",
]

#: idle connections older than this are closed rather than reused (httpx's default too)
KEEPALIVE_EXPIRY = 5.0


class InvalidRequest(ValueError):
    """The URL or a header value cannot be sent; retrying will not help."""


class Target(NamedTuple):
    origin: Origin
    path: str  # the request-target: path and query
    host_header: str
    authorization: str | None  # Basic credentials from the URL's user info


def safe_url(url: str) -> str:
    """``url`` without user info, query or fragment (they may carry tokens): what messages quote."""
    parts = urlsplit(str(url))
    if not parts.scheme:  # a relative reference (e.g. a Location header)
        return parts.path
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


@functools.lru_cache(maxsize=4096)
def parse_target(url: str) -> Target:
    """Split ``url`` once (cached: a destination renders few distinct URLs). :raises InvalidRequest:"""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise InvalidRequest(f"cannot parse the URL: {exc}") from None
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise InvalidRequest("the URL needs http:// or https:// and a host")
    host = parts.hostname
    if not host.isascii():
        try:
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidRequest("the URL's host is not a valid internationalized name") from None
    port = port or (443 if scheme == "https" else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    if any(c in path for c in " \r\n\t\0"):
        raise InvalidRequest("the URL's path contains whitespace or control characters")
    netloc = f"[{host}]" if ":" in host else host
    default = port == (443 if scheme == "https" else 80)
    auth = None
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        auth = "Basic " + base64.b64encode(pair).decode("ascii")
    return Target(Origin(scheme, host, port), path, netloc if default else f"{netloc}:{port}", auth)


def encode_head(method: str, target: Target, headers: dict[str, str], length: int | None) -> bytes:
    """The request line and header block. :raises InvalidRequest: a header breaks the framing."""
    lines = [f"{method} {target.path} HTTP/1.1", f"host: {target.host_header}"]
    lines.extend(f"{k}: {v}" for k, v in headers.items())
    if target.authorization and "authorization" not in headers:
        lines.append(f"authorization: {target.authorization}")
    if length is not None:
        lines.append(f"content-length: {length}")
    lines += ["", ""]
    head = "\r\n".join(lines)
    # one C-speed scan instead of a per-value check: any CR, LF or NUL inside a value shows up here
    if head.count("\n") != len(lines) - 1 or head.count("\r") != len(lines) - 1 or "\0" in head:
        raise InvalidRequest("a header value contains a line break or NUL")
    try:
        return head.encode("latin-1")
    except UnicodeEncodeError:
        raise InvalidRequest("a header value has characters outside ISO-8859-1") from None


class ConnectionPool:
    """Keep-alive connections per origin (LIFO), guarded by :class:`AddressGuard` at connect time.

    Holds at most ``max_idle`` idle connections in all; it does not bound
    connections in use — the transport's concurrency limit does.
    """

    def __init__(self, guard: AddressGuard, ssl_context: Callable[[], ssl.SSLContext], *, max_idle: int) -> None:
        self.guard = guard
        self._ssl_context = ssl_context
        self.max_idle = max_idle
        self._idle: dict[Origin, list[Connection]] = {}
        self._n_idle = 0
        self.closed = False

    async def request(
        self, method: str, target: Target, headers: dict[str, str], body: bytes, *, body_limit: int
    ) -> Response:
        """Send one request and read its answer (see the module docstring for what raises)."""
        head = encode_head(method, target, headers, None if method == "HEAD" else len(body))
        conn = self._take(target.origin)
        if conn is not None:
            try:
                return await self._exchange(conn, head, body, body_limit, method == "HEAD")
            except (OSError, ProtocolError):
                # A kept-alive connection that the server closed meanwhile fails before any answer
                # byte; resend once on a new connection (receivers dedupe on webhook-id anyway).
                # Our deadline cannot land here: inside this call it is a CancelledError.
                if conn.got_bytes:
                    raise
        conn = await self._connect(target.origin)
        return await self._exchange(conn, head, body, body_limit, method == "HEAD")

    async def _exchange(self, conn: Connection, head: bytes, body: bytes, limit: int, no_body: bool) -> Response:
        try:
            response = await conn.send(head, body, body_limit=limit, no_body=no_body)
        except BaseException:
            conn.abort()  # cancelled, timed out or failed: its state is unknown
            raise
        if conn.reusable and not self.closed:
            self._put(conn)
        else:
            conn.abort()
        return response

    def _take(self, origin: Origin) -> Connection | None:
        stack = self._idle.get(origin)
        now = time.monotonic()
        while stack:
            conn = stack.pop()
            self._n_idle -= 1
            if not conn.closed and now - conn.idle_since < KEEPALIVE_EXPIRY:
                return conn
            conn.abort()
        return None

    def _put(self, conn: Connection) -> None:
        if self._n_idle >= self.max_idle:
            self._evict()
        conn.idle_since = time.monotonic()
        self._idle.setdefault(conn.origin, []).append(conn)
        self._n_idle += 1

    def _evict(self) -> None:
        """Close the longest-idle connection of the origin with the most idle ones."""
        stack = max(self._idle.values(), key=len)
        stack.pop(0).abort()
        self._n_idle -= 1

    async def _connect(self, origin: Origin) -> Connection:
        tls = self._ssl_context() if origin.scheme == "https" else None
        _transport, conn = await self.guard.connect(origin.host, origin.port, lambda: Connection(origin), tls)
        return conn

    async def aclose(self) -> None:
        """Close idle connections; those in use close when their request ends."""
        self.closed = True
        idle, self._idle, self._n_idle = self._idle, {}, 0
        for stack in idle.values():
            for conn in stack:
                conn.abort()
