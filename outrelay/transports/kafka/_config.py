"""Options of the ``kafka`` transport (validated, frozen, secrets masked).

Example::

    [destinations.kafka]
    transport = "kafka"
    bootstrap_servers = "broker1:9092,broker2:9092"
    topic = "events.{category}"          # a Template: {type} {category} {stream} {tenant} ...
    security_protocol = "SASL_SSL"
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_username = "relay"
    sasl_password = "${KAFKA_PASSWORD}"
"""

from __future__ import annotations

import re
import string
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator

from outrelay.kit import Template, TransportConfig

__all__ = ["TOPIC_RE", "KafkaConfig"]

TOPIC_RE = re.compile(r"^[A-Za-z0-9._-]{1,249}$")


class KafkaConfig(TransportConfig):
    """Producer (and reader) options; see the module docstring.

    ``acks`` is always ``all``: "delivered" means every in-sync replica has the
    record. ``enable_idempotence`` defaults on (the broker drops retried
    duplicates); turn it off only for brokers that lack InitProducerId
    (tansu, some emulators). ``max_message_bytes`` bounds the event data;
    ``batch_bytes`` bounds one record batch per partition and must stay under
    the broker's ``message.max.bytes`` (1 MiB by default).
    """

    bootstrap_servers: str | list[str] = "127.0.0.1:9092"
    topic: str
    mode: Literal["binary", "structured"] = "binary"
    client_id: str = "outrelay"
    enable_idempotence: bool = True
    linger_ms: int = Field(0, ge=0, le=60_000)
    batch_bytes: int = Field(1_000_000, ge=1024, le=64 * 1024 * 1024)
    max_message_bytes: int = Field(900_000, ge=1, le=64 * 1024 * 1024)
    compression: Literal["none", "gzip", "snappy", "lz4", "zstd"] = "none"
    request_timeout: float = Field(30.0, gt=0, le=600, description="seconds a send may take before it is retried")
    connect_timeout: float = Field(10.0, gt=0, le=600, description="seconds open() waits for the cluster")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_password: SecretStr | None = None
    ssl_check_hostname: bool = True

    @field_validator("topic")
    @classmethod
    def _template(cls, v: str) -> str:
        template = Template(v, where="topic")
        literal = "".join(lit for lit, *_ in string.Formatter().parse(v))
        if (template.is_static and not TOPIC_RE.match(v)) or not TOPIC_RE.match(literal or "x"):
            raise ValueError(f"topic {v!r}: Kafka topic names use only letters, digits, '.', '_' and '-'")
        return v

    @model_validator(mode="after")
    def _security(self) -> KafkaConfig:
        sasl = self.security_protocol.startswith("SASL")
        if sasl and (self.sasl_mechanism is None or not self.sasl_username or self.sasl_password is None):
            raise ValueError(
                f"security_protocol={self.security_protocol} needs sasl_mechanism, sasl_username and sasl_password"
            )
        if not sasl and self.sasl_mechanism is not None:
            raise ValueError("sasl_mechanism needs security_protocol SASL_PLAINTEXT or SASL_SSL")
        if self.max_message_bytes >= self.batch_bytes:
            raise ValueError("max_message_bytes must be smaller than batch_bytes (headers need room)")
        return self

    @property
    def servers(self) -> list[str]:
        raw = self.bootstrap_servers
        items = raw.split(",") if isinstance(raw, str) else raw
        return [s.strip() for s in items if s.strip()]
