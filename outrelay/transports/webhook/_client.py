"""The webhook's HTTP client, built on ``open``: one keep-alive pool behind the SSRF guard.

:class:`WebhookClient` holds what an open transport owns — the
:class:`~._http.ConnectionPool` (connections only through
:class:`~._ssrf.AddressGuard`), the TLS context (httpx's, with certifi's CAs,
built once on the first https connection: loading the CA bundle costs
~100 ms of CPU) and the ``concurrency`` slots — and performs one exchange
under **one deadline**, ``timeout`` seconds for name resolution, connect,
TLS, sending and the *whole* answer (a receiver dripping its answer fails on
time, and that connection is dropped).

Exceptions are the client's own, mapped by the transport through
:data:`~._errors.ERRORS`: :class:`AnswerTimeout` (the deadline passed),
:class:`~._ssrf.PrivateAddressRefused`, :class:`~._http.InvalidRequest`,
:class:`~._http.ProtocolError`, ``OSError`` (connect, reset, TLS).
"""

from __future__ import annotations

import asyncio
import ssl

import httpx

from outrelay.transports.webhook._config import WebhookConfig
from outrelay.transports.webhook._http import ConnectionPool, Response, parse_target
from outrelay.transports.webhook._ssrf import AddressGuard

__all__ = ["BODY_LIMIT", "AnswerTimeout", "WebhookClient"]

#: answer bytes read at most: enough to keep the connection reusable for ordinary answers and to
#: quote an error, without letting an endpoint make the relay download a large body
BODY_LIMIT = 64 * 1024


class AnswerTimeout(TimeoutError):
    """No whole answer within the destination's ``timeout`` (the connection was dropped)."""


class WebhookClient:
    """See the module docstring. :meth:`open` does no I/O; :meth:`aclose` closes idle connections
    (those in use close when their request ends); it may be opened again."""

    def __init__(self, cfg: WebhookConfig) -> None:
        self.cfg = cfg
        self._ssl: ssl.SSLContext | None = None
        self._pool: ConnectionPool | None = None
        #: at most ``concurrency`` requests in flight; one request per connection, so this bounds
        #: the connections in use too (made on open: a semaphore binds to the loop that uses it)
        self.slots = asyncio.Semaphore(1)

    def _ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(verify=self.cfg.verify_tls, trust_env=False)
            self._ssl.set_alpn_protocols(["http/1.1"])
        return self._ssl

    def open(self) -> None:
        """Create the connection pool (no I/O)."""
        if self._pool is None:
            guard = AddressGuard(allow_private=self.cfg.allow_private_network)
            self._pool = ConnectionPool(guard, self._ssl_context, max_idle=self.cfg.max_connections)
            self.slots = asyncio.Semaphore(min(self.cfg.concurrency, self.cfg.max_connections))

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()

    async def exchange(self, method: str, url: str, headers: dict[str, str], body: bytes) -> Response:
        """One request and its whole answer (at most :data:`BODY_LIMIT` bytes of body kept), bounded
        by ``timeout`` seconds in all. :raises: see the module docstring."""
        pool = self._pool
        if pool is None:
            raise ConnectionError("the webhook transport was closed")
        target = parse_target(url)
        limit = self.cfg.timeout
        try:
            async with asyncio.timeout(limit) as deadline:
                try:
                    return await pool.request(method, target, headers, body, body_limit=BODY_LIMIT)
                except TimeoutError:
                    if deadline.expired():
                        raise
                    # an OS-level ETIMEDOUT is a network failure, not our deadline
                    raise ConnectionError("the connection timed out") from None
        except TimeoutError:
            raise AnswerTimeout(
                f"did not answer within {limit:g}s (one deadline for connect, send and the whole answer)"
            ) from None
