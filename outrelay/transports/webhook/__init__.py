"""The ``webhook`` transport plugin: Standard-Webhooks-signed HTTP/1.1 delivery (TLS context from httpx)."""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "webhook", "outrelay.transports.webhook._transport:WebhookTransport", requires=("httpx",)
)
