"""Options of the ``pulsar`` transport (see ``_transport``; the message mapping is in ``_wire``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr

from outrelay.kit import TransportConfig

__all__ = ["PulsarConfig"]


class PulsarConfig(TransportConfig):
    """Options of the ``pulsar`` transport (see the module docstring)."""

    service_url: str = "pulsar://127.0.0.1:6650"
    topic: str = "persistent://public/default/{type}"
    token: SecretStr | None = None
    tls_trust_certs_file_path: str | None = None
    tls_allow_insecure_connection: bool = False
    tls_validate_hostname: bool = True
    deduplication: bool = False
    producer_name: str | None = Field(None, description="default outrelay-<destination>; used with deduplication")
    batching: bool = True
    batching_max_messages: int = Field(1000, ge=1, le=100_000)
    batching_max_publish_delay_ms: int = Field(5, ge=0, le=10_000)
    max_pending_messages: int = Field(10_000, ge=1, le=1_000_000)
    send_timeout: float = Field(30.0, gt=0, le=600)
    connect_timeout: float = Field(5.0, gt=0, le=120)
    operation_timeout: float = Field(10.0, ge=1, le=600)
    max_message_bytes: int = Field(5_242_880 - 65_536, ge=1024, description="broker maxMessageSize minus headroom")
    client_log_level: Literal["debug", "info", "warn", "error"] = Field(
        "warn", description="'debug' routes the C++ client's log into logging (slow); others print at that level"
    )
