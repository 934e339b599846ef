"""The ``mqtt`` transport's options and its topic escaping."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator

from outrelay.kit import TransportConfig

__all__ = ["MqttConfig", "escape_level"]

_UNSAFE = re.compile(r"[%/+#$\x00-\x1f\x7f]")


def escape_level(value: str) -> str:
    """Keep a substituted value inside one topic level: ``% / + # $`` and control
    characters are percent-encoded (a tenant cannot reach another tenant's level)."""
    return _UNSAFE.sub(lambda m: f"%{ord(m.group()):02X}", value)


class MqttConfig(TransportConfig):
    """Options of one ``mqtt`` destination.

    ``topic`` is a template (``"events/{tenant}/{type}"``); its literal text may
    not hold wildcards (``+``, ``#``) or NUL. ``max_message_bytes`` bounds the
    event data; the broker's own Maximum Packet Size, learned at connect, is
    enforced on the whole PUBLISH packet as well.
    """

    host: str = "127.0.0.1"
    port: int = Field(1883, ge=1, le=65535)
    topic: str = "events/{type}"
    username: str | None = None
    password: SecretStr | None = None
    client_id: str | None = Field(None, description="default: outrelay-<destination>-<random>")
    keepalive: int = Field(30, ge=5, le=65535)
    connect_timeout: float = Field(5.0, gt=0)
    ack_timeout: float = Field(5.0, gt=0, description="how long a batch waits for its PUBACKs")
    max_message_bytes: int = Field(1_048_576, ge=1, le=256 * 1024 * 1024)

    @field_validator("topic")
    @classmethod
    def _no_wildcards(cls, value: str) -> str:
        literal = re.sub(r"\{[a-z]+\}", "", value)
        if not value or any(c in literal for c in "+#\x00"):
            raise ValueError(f"topic {value!r} must be non-empty and free of '+', '#' and NUL (MQTT topic names)")
        return value
