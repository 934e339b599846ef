"""The ``webhook`` transport: signed HTTP POSTs.

Each event is one ``POST`` to the rendered ``url``, signed per Standard
Webhooks (``webhook-id`` = event id, so receivers can dedupe), carrying the
CloudEvents HTTP binding: structured JSON by default, ``ce-*`` headers in
binary mode (values percent-encoded as the binding requires: non-ASCII, space,
``"`` and ``%``; the data's type in ``Content-Type``). Connections are kept alive and pooled per destination by a
small HTTP/1.1 client of our own (:mod:`._http`; httpx cost ~1 ms of CPU
per request on this path) that connects only through the SSRF guard.

Each attempt has **one deadline**, ``timeout`` seconds, covering name
resolution, connect, TLS, sending the request and reading the *whole*
answer: a receiver that drips its answer a byte at a time still fails
the attempt on time (RetryLater), and that connection is dropped.

Outcome of one request (see :func:`classify`):

==========================  =====================================================
2xx                         Delivered
3xx                         Rejected — redirects are not followed (configure the final URL)
408, 429, 5xx               RetryLater, with ``Retry-After`` (seconds or HTTP-date)
410 Gone                    Rejected(disable_destination=True): the relay disables the
                            destination and keeps the event pending
other 4xx                   Rejected
network error, deadline     RetryLater
refused address (SSRF)      Rejected, naming ``allow_private_network``
==========================  =====================================================

``send`` posts different streams concurrently (``concurrency`` at once) and
one stream's events sequentially in batch order; after a stream's first
failure its later events are not sent and come back RetryLater
(``ordered_batches``). ``open`` does no I/O: a down endpoint shows up as
RetryLater results, and ``check`` probes it. Client exceptions never escape:
:mod:`~outrelay.transports.webhook._errors` is the one boundary that maps them.

``check`` (``outrelay check``) posts a **signed ping** by default, after
GitHub's webhook ping: one real event of type ``outrelay.check`` (see
:mod:`._ping`), encoded, signed and headed exactly as ``send`` posts an
event, so a secret the receiver rejects fails the check (401/403 →
PermanentError saying to check the secret) instead of passing as
"reachable". Other answers are read by :func:`._errors.check_ping_answer`.
``check_ping = false`` keeps the older probe for receivers that must never
see a non-business event: a ``HEAD`` (nothing signed, nothing posted) where
any HTTP answer means reachable — it cannot detect a wrong secret.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import httpx

from outrelay.kit import (
    STRUCTURED_CONTENT_TYPE,
    Capabilities,
    Event,
    Message,
    Reader,
    Rejected,
    SendResult,
    Template,
    Transport,
    UsageError,
    binary_headers,
    send_in_key_order,
    to_structured,
)
from outrelay.kit import outrelay_version as __version__
from outrelay.transports.webhook._config import WebhookConfig
from outrelay.transports.webhook._errors import (
    check_ping_answer,
    classify,
    parse_retry_after,
    post_once,
    probe,
    safe_url,
)
from outrelay.transports.webhook._http import ConnectionPool
from outrelay.transports.webhook._ping import ping_event
from outrelay.transports.webhook._signing import normalize_secrets, signature_headers
from outrelay.transports.webhook._ssrf import AddressGuard

__all__ = ["WebhookConfig", "WebhookTransport", "classify", "parse_retry_after", "safe_url"]


class WebhookTransport(Transport):
    """See the module docstring; options in :class:`WebhookConfig`."""

    name = "webhook"
    Config = WebhookConfig

    def __init__(self, config: WebhookConfig, *, destination: str = "webhook") -> None:
        super().__init__(config, destination=destination)
        self.cfg: WebhookConfig = config
        # substituted values are percent-encoded so a stream like "a/b?c" cannot change the URL's shape;
        # a "." or ".." value is rejected (segment="url", see outrelay.core.segments)
        self._template = Template(config.url, where=f"destinations.{destination}.url", segment="url")
        self._keys = normalize_secrets(config.secrets())
        self._static_headers = {"user-agent": f"outrelay/{__version__}"} | {
            k.lower(): v.get_secret_value() for k, v in config.headers.items()
        }
        self._pool: ConnectionPool | None = None
        self._slots: asyncio.Semaphore | None = None
        self._ssl: ssl.SSLContext | None = None
        self._state = "new"

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=True,
            native_dedupe=False,
            max_batch_count=max(100, self.cfg.concurrency),
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=(self.cfg.mode,),
            reader=True,
        )

    def target(self, event: Event) -> str:
        return self._template.render(event)

    def _ssl_context(self) -> ssl.SSLContext:
        # Loading the CA bundle costs ~100 ms of CPU: do it once per transport, on the
        # first https connection (never for plain http). httpx's context = certifi's CAs.
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context(verify=self.cfg.verify_tls, trust_env=False)
            self._ssl.set_alpn_protocols(["http/1.1"])
        return self._ssl

    def _new_pool(self) -> ConnectionPool:
        guard = AddressGuard(allow_private=self.cfg.allow_private_network)
        return ConnectionPool(guard, self._ssl_context, max_idle=self.cfg.max_connections)

    async def open(self) -> None:
        """Create the connection pool (no I/O); opening again after close is allowed."""
        if self._pool is None:
            self._pool = self._new_pool()
            # one request per connection: this bounds the connections in use too
            self._slots = asyncio.Semaphore(min(self.cfg.concurrency, self.cfg.max_connections))
        self._state = "open"

    async def close(self) -> None:
        pool, self._pool, self._slots = self._pool, None, None
        if self._state == "open":
            self._state = "closed"
        if pool is not None:
            await pool.aclose()

    # -- sending -----------------------------------------------------------------

    def _request(self, event: Event) -> tuple[dict[str, str], bytes]:
        if self.cfg.mode == "binary":
            body = event.data
            headers = binary_headers(event, percent=True)  # HTTP binding 3.1.3.2: header-safe values
            if event.content_type:
                headers["content-type"] = event.content_type
        else:
            body = to_structured(event)
            headers = {"content-type": STRUCTURED_CONTENT_TYPE}
        headers.update(self._static_headers)
        headers.update(signature_headers(self._keys, event.id, body))
        return headers, body

    async def _post(self, pool: ConnectionPool, slots: asyncio.Semaphore, message: Message) -> SendResult:
        size = len(message.event.data)
        if size > self.cfg.max_message_bytes:
            return Rejected(f"event data of {size} bytes exceeds max_message_bytes={self.cfg.max_message_bytes}")
        async with slots:  # at most ``concurrency`` requests in flight per destination
            headers, body = self._request(message.event)  # signed now, not before the wait
            return await post_once(pool, message.target, headers, body, self.cfg.timeout)

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        pool, slots = self._pool, self._slots
        if pool is None or slots is None or self._state != "open":
            raise UsageError(f"webhook transport {self.destination!r} is {self._state}, not open")
        return await send_in_key_order(batch, lambda m: self._post(pool, slots, m))

    # -- probing -----------------------------------------------------------------

    async def check(self) -> str:
        """Probe the endpoint through the same client, SSRF guard and deadline as ``send``; one line.

        With ``check_ping`` (the default) POST a signed ping — an ``outrelay.check`` event encoded,
        signed and headed exactly as ``send`` would post it — to the URL rendered for it: a 2xx
        means the receiver verified and accepted it. With ``check_ping = false`` send a ``HEAD``
        instead (nothing signed or posted): any HTTP answer means reachable.

        :raises PermanentError: the receiver answered the ping 401/403 (signature or credentials
            rejected: check the secret, never printed), a 3xx or another 4xx (the line names the
            status and what the receiver said); the address is refused (SSRF guard); the URL or a
            header cannot be sent.
        :raises RetryableError: the ping got 408/429/5xx; cannot connect; an invalid answer; no
            whole answer within ``timeout``.
        """
        ping = ping_event(self.destination)
        url = self.target(ping)
        pool = self._pool or self._new_pool()
        dest, limit = self.destination, self.cfg.timeout
        try:
            if self.cfg.check_ping:
                headers, body = self._request(ping)
                response = await probe(pool, "POST", url, headers, body, limit, destination=dest)
            else:
                response = await probe(pool, "HEAD", url, dict(self._static_headers), b"", limit, destination=dest)
        finally:
            if pool is not self._pool:
                await pool.aclose()
        if not self.cfg.check_ping:
            return f"{safe_url(url)} reachable (HEAD answered {response.status}; check_ping = false, secret not tested)"
        check_ping_answer(response, url, signed=bool(self._keys), destination=dest)
        kind, signing = (
            ("a signed", f"signed with {len(self._keys)} secret(s)") if self._keys else ("an unsigned", "no secret")
        )
        return (
            f"{safe_url(url)} accepted {kind} ping (POST {ping.type} answered {response.status}; "
            f"{self.cfg.mode} mode, {signing})"
        )

    @classmethod
    def conformance_local_peer(cls, config: WebhookConfig) -> dict[str, Any]:
        """A webhook has no broker to read back from: ``outrelay conformance`` starts a local receiver
        per check and points a copy of the destination at it (see :func:`._reader.local_peer`)."""
        from outrelay.transports.webhook._reader import local_peer

        return local_peer(config.secrets() or None)

    #: the durability check's late reader: the receiver keeps what it accepted
    conformance_late_reader_options: ClassVar[Mapping[str, Any]] = {"from_beginning": True}

    def reader(self, target: str, **options: Any) -> Reader:
        """Read what a running :class:`~outrelay.transports.webhook.receiver.WebhookReceiver`
        at ``target`` accepted (``from_beginning=True``: also before the reader started).
        :raises UsageError: no receiver serves ``target``."""
        from outrelay.transports.webhook._reader import WebhookReader

        return WebhookReader(target, from_beginning=bool(options.get("from_beginning")))

    def __repr__(self) -> str:
        return f"<WebhookTransport destination={self.destination!r} url={safe_url(self.cfg.url)!r} {self._state}>"
