"""How one event goes on the wire: the request body and headers of its POST.

Structured mode (default): the CloudEvents JSON (``application/cloudevents+json``).
Binary mode: the event's data as the body, its content type in ``Content-Type``
and the attributes in ``ce-*`` headers, percent-encoded as the HTTP binding
requires (non-ASCII, space, ``"`` and ``%``). Then the static ``headers`` of
the destination, and the Standard Webhooks signature (``webhook-id`` = event
id, so receivers can dedupe) — signed when encoded, so encode right before
sending, not before waiting for a slot.
"""

from __future__ import annotations

from outrelay.kit import STRUCTURED_CONTENT_TYPE, Event, binary_headers, to_structured
from outrelay.kit import outrelay_version as __version__
from outrelay.transports.webhook._config import WebhookConfig
from outrelay.transports.webhook._signing import normalize_secrets, signature_headers

__all__ = ["WireFormat"]


class WireFormat:
    """The encoding of one destination (see the module docstring)."""

    __slots__ = ("binary", "keys", "static_headers")

    def __init__(self, cfg: WebhookConfig) -> None:
        self.binary = cfg.mode == "binary"
        self.keys = normalize_secrets(cfg.secrets())
        self.static_headers = {"user-agent": f"outrelay/{__version__}"} | {
            k.lower(): v.get_secret_value() for k, v in cfg.headers.items()
        }

    def encode(self, event: Event) -> tuple[dict[str, str], bytes]:
        """The headers and body of ``event``'s POST, signed now."""
        if self.binary:
            body = event.data
            headers = binary_headers(event, percent=True)  # HTTP binding 3.1.3.2: header-safe values
            if event.content_type:
                headers["content-type"] = event.content_type
        else:
            body = to_structured(event)
            headers = {"content-type": STRUCTURED_CONTENT_TYPE}
        headers.update(self.static_headers)
        headers.update(signature_headers(self.keys, event.id, body))
        return headers, body
