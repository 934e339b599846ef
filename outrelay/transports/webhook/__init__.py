"""The ``webhook`` transport plugin: Standard-Webhooks-signed HTTP/1.1 delivery (TLS context from httpx)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from outrelay.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from outrelay.core.registry import Registry


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    registry.add_transport("webhook", "outrelay.transports.webhook._transport:WebhookTransport", requires=("httpx",))
