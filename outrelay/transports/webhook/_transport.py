"""The ``webhook`` transport: signed HTTP POSTs with httpx.

Each event is one ``POST`` to the rendered ``url``, signed per Standard
Webhooks (``webhook-id`` = event id, so receivers can dedupe), carrying the
CloudEvents HTTP binding: structured JSON by default, ``ce-*`` headers in
binary mode. Connections are pooled per destination.

Outcome of one request (see :func:`classify`):

==========================  =====================================================
2xx                         Delivered
3xx                         Rejected — redirects are not followed (configure the final URL)
408, 429, 5xx               RetryLater, with ``Retry-After`` (seconds or HTTP-date)
410 Gone                    Rejected(disable_destination=True): the relay disables the
                            destination and keeps the event pending
other 4xx                   Rejected
network error, timeout      RetryLater
refused address (SSRF)      Rejected, naming ``allow_private_network``
==========================  =====================================================

``send`` posts different streams concurrently (``concurrency`` at once) and
one stream's events sequentially in batch order; after a stream's first
failure its later events are not sent and come back RetryLater
(``ordered_batches``). ``open`` does no I/O: a down endpoint shows up as
RetryLater results, and ``check`` probes it. httpx exceptions never escape:
:func:`~outrelay.transports.webhook._errors.post_once` is the one boundary that maps them.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import httpx

from outrelay._version import __version__
from outrelay.core import cloudevents
from outrelay.core.envelope import Event
from outrelay.core.errors import PermanentError, RetryableError, UsageError
from outrelay.core.templates import Template
from outrelay.core.transport import (
    Capabilities,
    Message,
    Reader,
    Rejected,
    SendResult,
    Transport,
    send_in_key_order,
)
from outrelay.transports.webhook._config import WebhookConfig
from outrelay.transports.webhook._errors import classify, describe, parse_retry_after, post_once, safe_url
from outrelay.transports.webhook._signing import normalize_secrets, signature_headers
from outrelay.transports.webhook._ssrf import GuardedHTTPTransport, PrivateAddressRefused

__all__ = ["WebhookConfig", "WebhookTransport", "classify", "parse_retry_after", "safe_url"]


class WebhookTransport(Transport):
    """See the module docstring; options in :class:`WebhookConfig`."""

    name = "webhook"
    Config = WebhookConfig

    def __init__(self, config: WebhookConfig, *, destination: str = "webhook") -> None:
        super().__init__(config, destination=destination)
        self.cfg: WebhookConfig = config
        # substituted values are percent-encoded so a stream like "a/b?c" cannot change the URL's shape
        self._template = Template(
            config.url, where=f"destinations.{destination}.url", escape=lambda v: quote(v, safe="")
        )
        self._keys = normalize_secrets(config.secrets())
        self._static_headers = {"user-agent": f"outrelay/{__version__}"} | {
            k.lower(): v.get_secret_value() for k, v in config.headers.items()
        }
        self._clients: list[httpx.AsyncClient] = []
        self._idle: asyncio.LifoQueue[httpx.AsyncClient] | None = None
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
        # Loading the CA bundle costs ~100 ms of CPU: do it once per transport,
        # and not at all when the URL is plain http.
        if self._ssl is None:
            if self.cfg.url.lower().startswith("https://"):
                self._ssl = httpx.create_ssl_context(verify=self.cfg.verify_tls, trust_env=False)
            else:
                self._ssl = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        return self._ssl

    def _new_client(self, max_connections: int) -> httpx.AsyncClient:
        transport = GuardedHTTPTransport(
            allow_private=self.cfg.allow_private_network,
            ssl_context=self._ssl_context(),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )
        # trust_env=False: an environment proxy would bypass the address guard
        return httpx.AsyncClient(transport=transport, timeout=self.cfg.timeout, follow_redirects=False, trust_env=False)

    async def open(self) -> None:
        """Create the connection pool (no I/O); opening again after close is allowed."""
        if not self._clients:
            # ``concurrency`` small pools instead of one big one: httpcore's pool
            # scans all its connections on every request, so its CPU cost per
            # request grows with the pool; a lane borrows one pool per request.
            n = self.cfg.concurrency
            per_pool = max(1, -(-self.cfg.max_connections // n))
            self._clients = [self._new_client(per_pool) for _ in range(n)]
            self._idle = asyncio.LifoQueue()
            for c in self._clients:
                self._idle.put_nowait(c)
        self._state = "open"

    async def close(self) -> None:
        clients, self._clients, self._idle = self._clients, [], None
        if self._state == "open":
            self._state = "closed"
        await asyncio.gather(*(c.aclose() for c in clients), return_exceptions=True)

    # -- sending -----------------------------------------------------------------

    def _request(self, event: Event, url: str) -> tuple[dict[str, str], bytes]:
        if self.cfg.mode == "binary":
            body = event.data
            headers = cloudevents.binary_headers(event)
            if event.content_type:
                headers["content-type"] = event.content_type
        else:
            body = cloudevents.to_structured(event)
            headers = {"content-type": cloudevents.STRUCTURED_CONTENT_TYPE}
        headers.update(self._static_headers)
        headers.update(signature_headers(self._keys, event.id, body))
        return headers, body

    async def _post(self, idle: asyncio.LifoQueue[httpx.AsyncClient], message: Message) -> SendResult:
        size = len(message.event.data)
        if size > self.cfg.max_message_bytes:
            return Rejected(f"event data of {size} bytes exceeds max_message_bytes={self.cfg.max_message_bytes}")
        client = await idle.get()  # at most ``concurrency`` requests in flight per destination
        try:
            headers, body = self._request(message.event, message.target)  # signed now, not before the wait
            return await post_once(client, message.target, headers, body, self.cfg.timeout)
        finally:
            idle.put_nowait(client)

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        idle = self._idle
        if idle is None or self._state != "open":
            raise UsageError(f"webhook transport {self.destination!r} is {self._state}, not open")
        return await send_in_key_order(batch, lambda m: self._post(idle, m))

    # -- probing -----------------------------------------------------------------

    async def check(self) -> str:
        """``HEAD`` the endpoint (no event is sent): any HTTP answer means reachable.

        :raises PermanentError: the address is refused (SSRF guard) or the URL is invalid.
        :raises RetryableError: cannot connect or no answer within ``timeout``.
        """
        url = self.target(Event(type="outrelay.check", stream="check"))
        own = not self._clients
        client = self._clients[0] if self._clients else self._new_client(1)
        try:
            response = await client.head(url, headers=self._static_headers)
        except PrivateAddressRefused as exc:
            raise PermanentError(str(exc), destination=self.destination) from None
        except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise PermanentError(
                f"invalid webhook URL {safe_url(url)}: {describe(exc)}; fix the destination's url",
                destination=self.destination,
            ) from None
        except httpx.TimeoutException:
            raise RetryableError(
                f"{safe_url(url)} did not answer within {self.cfg.timeout:g}s; check the URL or raise timeout",
                destination=self.destination,
            ) from None
        except httpx.TransportError as exc:
            raise RetryableError(
                f"cannot reach {safe_url(url)}: {describe(exc)}; check the URL and that the receiver is up",
                destination=self.destination,
            ) from None
        finally:
            if own:
                await client.aclose()
        signing = f"signed with {len(self._keys)} secret(s)" if self._keys else "unsigned"
        return f"{safe_url(url)} reachable (HEAD answered {response.status_code}; {self.cfg.mode} mode, {signing})"

    def reader(self, target: str, **options: Any) -> Reader:
        """Read what a running :class:`~outrelay.transports.webhook.receiver.WebhookReceiver`
        at ``target`` accepted. :raises UsageError: no receiver serves ``target``."""
        from outrelay.transports.webhook._reader import WebhookReader

        return WebhookReader(target)

    def __repr__(self) -> str:
        return f"<WebhookTransport destination={self.destination!r} url={safe_url(self.cfg.url)!r} {self._state}>"
