"""Options of a ``webhook`` destination (validated once, frozen, secrets masked)."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import ConfigDict, Field, SecretStr, field_validator

from outrelay.kit import Template, TransportConfig
from outrelay.transports.webhook._signing import decode_secret

__all__ = ["RESERVED_HEADERS", "WebhookConfig"]

_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")

#: headers the transport sets itself; ``headers`` may not override them
RESERVED_HEADERS = frozenset(
    {
        "content-type",
        "content-length",
        "host",
        "webhook-id",
        "webhook-timestamp",
        "webhook-signature",
        "transfer-encoding",
        "connection",
    }
)


class WebhookConfig(TransportConfig):
    """``[destinations.NAME]`` options of the webhook transport.

    * ``url`` — ``http(s)://...``; may be a template (``https://x/{tenant}``).
    * ``secret`` — Standard Webhooks secret (``whsec_<base64>`` or a plain
      string used as raw bytes); a list signs with each (key rotation).
      ``None`` sends unsigned requests.
    * ``mode`` — ``structured`` (``application/cloudevents+json`` body) or
      ``binary`` (``ce-*`` headers, raw data, the event's content type).
    * ``timeout`` — one deadline in seconds per attempt, covering DNS, connect,
      TLS, sending and the whole answer (a receiver dripping its answer
      cannot stretch it); on expiry the attempt is RetryLater and its
      connection dropped. Waiting for a free ``concurrency`` slot is not counted.
    * ``max_connections`` — connections per destination: idle keep-alive
      ones beyond it are closed, and requests in flight never exceed it.
    * ``concurrency`` — requests in flight per batch (different streams).
    * ``headers`` — extra static headers (values are masked like secrets).
    * ``allow_private_network`` — permit loopback/private/link-local
      addresses (off: the SSRF guard refuses them).
    * ``max_message_bytes`` — larger event data is rejected unsent.
    * ``verify_tls`` — verify HTTPS certificates.
    * ``check_ping`` — what ``outrelay check`` sends. ``true``: a signed
      ping, one event of type ``outrelay.check`` encoded and signed exactly
      as real events are; 2xx passes, 401/403 fails as a rejected secret,
      other answers fail naming the status. ``false``: a ``HEAD`` only (for
      receivers that must never see a non-business event); any HTTP answer
      passes and a wrong secret goes unnoticed.
    """

    # a rejected secret or header value must not be echoed by ValidationError
    model_config = ConfigDict(hide_input_in_errors=True)

    url: str
    secret: SecretStr | list[SecretStr] | None = None
    mode: Literal["structured", "binary"] = "structured"
    timeout: float = Field(15.0, gt=0, le=600)
    max_connections: int = Field(100, ge=1, le=10_000)
    concurrency: int = Field(16, ge=1, le=10_000)
    headers: dict[str, SecretStr] = Field(default_factory=dict)
    allow_private_network: bool = False
    max_message_bytes: int = Field(1024 * 1024, ge=1, le=100 * 1024 * 1024)
    verify_tls: bool = True
    check_ping: bool = True

    @field_validator("url")
    @classmethod
    def _check_url(cls, v: str) -> str:
        Template(v)  # raises ConfigError (a ValueError) naming the bad placeholder
        if not v.lower().startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {v.split('://')[0]!r}://...")
        return v

    @field_validator("secret")
    @classmethod
    def _check_secret(cls, v: SecretStr | list[SecretStr] | None) -> SecretStr | list[SecretStr] | None:
        for s in [] if v is None else v if isinstance(v, list) else [v]:
            decode_secret(s.get_secret_value())  # a whsec_ secret must be valid base64
        return v

    @field_validator("headers")
    @classmethod
    def _check_headers(cls, v: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, value in v.items():
            if not _TOKEN.fullmatch(name):
                raise ValueError(f"header name {name!r} is not a valid HTTP header name")
            if name.lower() in RESERVED_HEADERS or name.lower().startswith("ce-"):
                raise ValueError(f"header {name!r} is set by the transport and cannot be overridden")
            if any(c in value.get_secret_value() for c in "\r\n\0"):
                raise ValueError(f"header {name!r}: the value contains a line break or NUL")
        return v

    def secrets(self) -> list[str]:
        """The configured secrets in clear (for signing only)."""
        if self.secret is None:
            return []
        items = self.secret if isinstance(self.secret, list) else [self.secret]
        return [s.get_secret_value() for s in items]
