"""Helpers shared by the webhook tests (a real receiver on loopback, no mocks)."""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

from outrelay import Event, Message
from outrelay.transports.webhook._transport import WebhookConfig, WebhookTransport

#: a Standard Webhooks secret (whsec_ + base64 of 32 bytes)
SECRET = "whsec_" + base64.b64encode(b"outrelay-webhook-test-secret-32b").decode()
#: a second secret, for rotation
OTHER_SECRET = "whsec_" + base64.b64encode(b"outrelay-webhook-rotated-key-32b").decode()


def make_transport(url: str, **options: Any) -> WebhookTransport:
    """A webhook transport to ``url`` signing with :data:`SECRET`, loopback allowed."""
    options.setdefault("secret", SECRET)
    options.setdefault("allow_private_network", True)
    return WebhookTransport(WebhookConfig(url=url, **options), destination="hooks")


def messages(transport: WebhookTransport, events: Sequence[Event]) -> list[Message]:
    """One :class:`Message` per event, targeted and keyed as the relay would."""
    return [Message(e, transport.target(e), e.stream) for e in events]


def event(stream: str = "s1", n: int = 0, **fields: Any) -> Event:
    """A small JSON event numbered ``n`` on ``stream``."""
    fields.setdefault("data", {"n": n})
    return Event(type="test.webhook", stream=stream, **fields)
