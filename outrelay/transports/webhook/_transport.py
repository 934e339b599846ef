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

Outcome of one request (built in one place, :func:`._answers.classify`):

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
failure its later events are not sent and come back NotSent (a RetryLater)
(``ordered_batches``). Each outcome is recorded in the relay's progress the
moment its answer arrives (:func:`~outrelay.kit.send_in_key_order`), so a
batch cut by ``attempt_timeout`` or a shutdown keeps every POST that was
answered 2xx, and a stream's next POST is not started when the previous
one's latency no longer fits before the deadline. ``open`` does no I/O
(:mod:`._client` builds the pool): a down endpoint shows up as RetryLater
results, and ``check`` probes it. Client exceptions never escape: the one
table :data:`~._errors.ERRORS` maps them. Shape: :mod:`._config`,
:mod:`._client` (HTTP client, one deadline), :mod:`._wire` (body, headers,
signature), :mod:`._answers` (answer → result), :mod:`._errors`,
:mod:`._reader` (reads a :mod:`.receiver`).

``check`` (``outrelay check``) posts a **signed ping** by default, after
GitHub's webhook ping: one real event of type ``outrelay.check`` (see
:mod:`._ping`), encoded, signed and headed exactly as ``send`` posts an
event, so a secret the receiver rejects fails the check (401/403 →
PermanentError saying to check the secret) instead of passing as
"reachable". Other answers are read by :func:`._answers.check_ping_answer`.
``check_ping = false`` keeps the older probe for receivers that must never
see a non-business event: a ``HEAD`` (nothing signed, nothing posted) where
any HTTP answer means reachable — it cannot detect a wrong secret.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from outrelay.kit import (
    Capabilities,
    LifecycleTransport,
    Message,
    Reader,
    Rejected,
    SendResult,
    send_in_key_order,
)
from outrelay.transports.webhook._answers import check_ping_answer, classify, parse_retry_after
from outrelay.transports.webhook._client import WebhookClient
from outrelay.transports.webhook._config import WebhookConfig
from outrelay.transports.webhook._errors import ERRORS
from outrelay.transports.webhook._http import safe_url
from outrelay.transports.webhook._ping import ping_event
from outrelay.transports.webhook._reader import WebhookReader, local_peer
from outrelay.transports.webhook._wire import WireFormat

__all__ = ["WebhookConfig", "WebhookTransport", "classify", "parse_retry_after", "safe_url"]


class WebhookTransport(LifecycleTransport[WebhookConfig]):
    """See the module docstring; options in :class:`WebhookConfig` (open/close rules:
    :class:`~outrelay.kit.LifecycleTransport`)."""

    name = "webhook"
    Config = WebhookConfig
    errors = ERRORS
    # substituted values are percent-encoded so a stream like "a/b?c" cannot change the URL's shape;
    # a "." or ".." value is rejected (segment="url", see outrelay.kit.Template)
    target_option = "url"
    target_segment = "url"
    #: the durability check's late reader: the receiver keeps what it accepted
    conformance_late_reader_options: ClassVar[Mapping[str, Any]] = {"from_beginning": True}

    def __init__(self, config: WebhookConfig, *, destination: str = "webhook") -> None:
        super().__init__(config, destination=destination)
        self._wire = WireFormat(config)
        self._client = WebhookClient(config)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(  # ordering by key; no native dedupe (receivers dedupe on webhook-id)
            ordered_batches=True,
            max_batch_count=max(100, self.cfg.concurrency),
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=(self.cfg.mode,),
            reader=True,
        )

    async def _open(self) -> None:
        """Create the connection pool (no I/O)."""
        self._client.open()

    async def _close(self) -> None:
        await self._client.aclose()

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        return await send_in_key_order(batch, self._post)

    async def _post(self, message: Message) -> SendResult:
        """POST one message once; every outcome a result (answers: :func:`classify`; client
        exceptions: :data:`ERRORS`)."""
        size = len(message.event.data)
        if size > self.cfg.max_message_bytes:
            return Rejected(f"event data of {size} bytes exceeds max_message_bytes={self.cfg.max_message_bytes}")
        url = message.target
        async with self._client.slots:  # at most ``concurrency`` requests in flight per destination
            headers, body = self._wire.encode(message.event)  # signed now, not before the wait
            try:
                response = await self._client.exchange("POST", url, headers, body)
            except Exception as exc:  # the client's own exceptions, mapped in one table
                return ERRORS.result(exc, f"cannot deliver to {safe_url(url)}")
        return classify(response.status, response.headers, url, response.body)

    async def _check(self) -> str:
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
        if self.cfg.check_ping:
            method, (headers, body) = "POST", self._wire.encode(ping)
        else:
            method, headers, body = "HEAD", dict(self._wire.static_headers), b""
        with ERRORS.boundary(f"cannot reach {safe_url(url)}", destination=self.destination):
            response = await self._client.exchange(method, url, headers, body)
        if not self.cfg.check_ping:
            return f"{safe_url(url)} reachable (HEAD answered {response.status}; check_ping = false, secret not tested)"
        keys = self._wire.keys
        check_ping_answer(response, url, signed=bool(keys), destination=self.destination)
        kind, signing = ("a signed", f"signed with {len(keys)} secret(s)") if keys else ("an unsigned", "no secret")
        return (
            f"{safe_url(url)} accepted {kind} ping (POST {ping.type} answered {response.status}; "
            f"{self.cfg.mode} mode, {signing})"
        )

    @classmethod
    def conformance_local_peer(cls, config: WebhookConfig) -> dict[str, Any]:
        """A webhook has no broker to read back from: ``outrelay conformance`` starts a local receiver
        per check and points a copy of the destination at it (see :func:`._reader.local_peer`)."""
        return local_peer(config.secrets() or None)

    def reader(self, target: str, **options: Any) -> Reader:
        """Read what a running :class:`~outrelay.transports.webhook.receiver.WebhookReceiver`
        at ``target`` accepted (``from_beginning=True``: also before the reader started).
        :raises UsageError: no receiver serves ``target``."""
        return WebhookReader(target, from_beginning=bool(options.get("from_beginning")))

    def __repr__(self) -> str:
        return f"<WebhookTransport destination={self.destination!r} url={safe_url(self.cfg.url)!r} {self.state}>"
