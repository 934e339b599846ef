"""The conformance suite against the webhook transport and a real receiver per target.

A webhook's consumer side is the receiver: ``provision(name)`` starts a
:class:`~outrelay.transports.webhook.receiver.WebhookReceiver` (verifying the
Standard Webhooks signature) in the check's own event loop and returns its
URL; ``transport.reader(url)`` reads the events that receiver verified and
acknowledged. The receiver stops when the check's loop ends.
"""

from __future__ import annotations

import functools

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.transports.webhook._reader import provision_receiver
from outrelay.transports.webhook._transport import WebhookTransport
from tests.services import free_port
from tests.transports.webhook_support import SECRET, make_transport


class TestWebhookConformance(ConformanceSuite):
    @pytest.fixture
    def conformance_target(self) -> ConformanceTarget:
        def unreachable(name: str) -> WebhookTransport:
            return make_transport(f"http://127.0.0.1:{free_port()}/{name}", timeout=2)

        return ConformanceTarget(
            make_transport=lambda url: make_transport(url, timeout=5),
            provision=functools.partial(provision_receiver, secrets=SECRET),
            make_unreachable=unreachable,
            label="webhook (outrelay WebhookReceiver, HTTP/1.1 on loopback, signatures verified)",
            read_timeout=5.0,
            timeout=10.0,
        )
