"""The conformance suite against the webhook transport and a real receiver per target.

A webhook's consumer side is the receiver: ``provision(name)`` starts a
:class:`~outrelay.transports.webhook.receiver.WebhookReceiver` (verifying the
Standard Webhooks signature) in the check's own event loop and returns its
URL; ``transport.reader(url)`` reads the events that receiver verified and
acknowledged. The receiver stops when the check's loop ends. The v2 hooks:
the fault proxy goes between transport and receiver; a path answering 400 is
the refused target, 429 with ``Retry-After`` the throttle; a transport
signing with another secret is the one without permission (its signed
``check()`` ping is answered 401).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import HTTP, Binding
from outrelay.conformance._harness import run_check
from outrelay.transports.webhook._reader import WebhookReader, provision_receiver
from outrelay.transports.webhook._transport import WebhookTransport
from outrelay.transports.webhook.receiver import Answer, WebhookReceiver, WebhookRequest
from tests.peers.conformance_hooks import VIA_TIMEOUT
from tests.services import free_port
from tests.transports.webhook_support import OTHER_SECRET, SECRET, make_transport

#: the transport's default mode is structured; the SDK's HTTP binding decodes it
WEBHOOK_BINDING = Binding("http", structured_only=True, sdk="http")
THROTTLE_HINT = 2.0


def _receiver(url: str) -> WebhookReceiver:
    rx = WebhookReceiver.serving(url)
    assert rx is not None, f"no receiver serves {url}"
    return rx


def _answer_on(url: str, suffix: str, answer: Answer) -> str:
    """Make the receiver behind ``url`` answer ``answer`` on ``url + suffix`` (elsewhere: 204 if verified)."""
    rx, path = _receiver(url), urlsplit(url + suffix).path

    def respond(req: WebhookRequest) -> Answer:
        if urlsplit(req.path).path == path:
            return answer
        return 204 if req.verified else 401

    rx.respond = respond
    return url + suffix


async def _refuse(url: str) -> str:
    return _answer_on(url, "-refused", 400)


async def _throttle(url: str) -> float:
    _answer_on(url, "", (429, {"retry-after": f"{THROTTLE_HINT:g}"}))
    return THROTTLE_HINT


def _upstream(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", parts.port or 80


def _via(url: str, host: str, port: int) -> WebhookTransport:
    parts = urlsplit(url)
    return make_transport(urlunsplit(parts._replace(netloc=f"{host}:{port}")), timeout=VIA_TIMEOUT)


class EveryRequest(WebhookReader):
    """Reads every request the receiver accepted, also those before it started (the durability check)."""

    async def start(self) -> None:
        await super().start()
        self._pos = 0


def webhook_target(**options: Any) -> ConformanceTarget:
    """The webhook transport (``options``: config overrides) against a fresh receiver per check, every hook wired."""

    def unreachable(name: str) -> WebhookTransport:
        return make_transport(f"http://127.0.0.1:{free_port()}/{name}", timeout=2, **options)

    return ConformanceTarget(
        make_transport=lambda url: make_transport(url, timeout=5, **options),
        provision=functools.partial(provision_receiver, secrets=SECRET),
        make_unreachable=unreachable,
        label="webhook (outrelay WebhookReceiver, HTTP/1.1 on loopback, signatures verified)",
        read_timeout=5.0,
        timeout=10.0,
        upstream=_upstream,
        make_transport_via=_via,
        refuse_target=_refuse,
        make_forbidden=lambda url: make_transport(url, secret=OTHER_SECRET, timeout=5, **options),
        throttle=_throttle,
        secret=SECRET,
        binding=HTTP if options.get("mode") == "binary" else WEBHOOK_BINDING,
        late_reader=lambda t, url: EveryRequest(url),
    )


class TestWebhookConformance(ConformanceSuite):
    @pytest.fixture
    def conformance_target(self) -> ConformanceTarget:
        return webhook_target()


class TestWebhookBinaryBinding:
    """``mode = "binary"``: ce-* HTTP headers, checked against the HTTP binding's rules and the SDK."""

    @pytest.mark.parametrize("check", ["binding_rules", "binding_sdk_decode"])
    def test_binding(self, check: str, tmp_path: Path) -> None:
        run_check(webhook_target(mode="binary"), check, tmp_path)
