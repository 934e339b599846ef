"""Config model of the ``servicebus`` transport and its client construction.

Two ways to authenticate, exactly one of them:

* ``connection_string`` (a :class:`~pydantic.SecretStr`: never printed;
  ``SharedAccessKey`` is masked in every error message);
* ``fully_qualified_namespace`` (``myns.servicebus.windows.net``) with
  ``DefaultAzureCredential`` from the optional ``azure-identity`` package
  (``pip install azure-identity``); without it, configuring this fails with
  the install line.

Entity properties the transport cannot discover over AMQP are declared:
``sessions = true`` when the queue/subscription requires sessions (then the
stream becomes the ``SessionId``: FIFO per stream), ``duplicate_detection =
true`` with ``dedupe_window`` (seconds) when the entity has duplicate
detection on (then a re-sent event id is dropped by Service Bus).
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from pydantic import Field, SecretStr, model_validator

from outrelay.kit import MissingExtraError, TransportConfig

__all__ = ["ServiceBusConfig", "broker_id", "make_client", "mask"]

#: Service Bus caps MessageId and SessionId at 128 characters.
MAX_ID_LENGTH = 128

#: Standard tier's 256 KiB per message, less room for the ``cloudEvents_*``
#: application properties and the AMQP envelope.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 - 16 * 1024

_KEY = re.compile(r"(SharedAccessKey|SharedAccessSignature)=[^;\s]*", re.IGNORECASE)


class ServiceBusConfig(TransportConfig):
    """Options of a ``servicebus`` destination (see the module docstring).

    ``queue`` or ``topic`` (one of them, a template such as ``"{category}"``);
    ``max_message_bytes`` bounds the event data (larger is Rejected, and so is
    a message that does not fit an empty batch of the entity's size);
    ``partitioned``: the entity is partitioned, so one batch holds one
    session/partition key only; ``sdk_retry_total``: retries inside the SDK
    (0: failures go straight back to the relay's backoff);
    ``busy_retry_after``: the wait suggested after ``server-busy`` (Service Bus
    advises 10 s); ``send_timeout``/``open_timeout``: bounds in seconds.
    """

    connection_string: SecretStr | None = None
    fully_qualified_namespace: str | None = None
    queue: str | None = None
    topic: str | None = None
    sessions: bool = False
    duplicate_detection: bool = False
    dedupe_window: float = Field(600.0, gt=0)
    partitioned: bool = False
    max_message_bytes: int = Field(DEFAULT_MAX_MESSAGE_BYTES, ge=1, le=100 * 1024 * 1024)
    sdk_retry_total: int = Field(0, ge=0, le=10)
    busy_retry_after: float | None = Field(10.0, ge=0)
    send_timeout: float = Field(30.0, gt=0)
    open_timeout: float = Field(10.0, gt=0)

    @model_validator(mode="after")
    def _one_of_each(self) -> ServiceBusConfig:
        if (self.queue is None) == (self.topic is None):
            raise ValueError("set exactly one of queue or topic")
        if (self.connection_string is None) == (self.fully_qualified_namespace is None):
            raise ValueError("set exactly one of connection_string or fully_qualified_namespace")
        return self

    @property
    def entity(self) -> str:
        return self.queue if self.queue is not None else self.topic  # type: ignore[return-value]

    @property
    def endpoint(self) -> str:
        """Where the entities live, for messages (no secrets)."""
        if self.fully_qualified_namespace:
            return f"sb://{self.fully_qualified_namespace}"
        raw = self.connection_string.get_secret_value() if self.connection_string else ""
        found = re.search(r"Endpoint=([^;]+)", raw, re.IGNORECASE)
        return found.group(1).rstrip("/") if found else "(connection string without Endpoint)"


def broker_id(value: str) -> str:
    """``value`` as a MessageId/SessionId: itself, or when longer than 128
    characters a stable ``sha256-<hex>`` of it (same input, same id: dedupe
    and FIFO per stream still hold; the full value stays in ``cloudEvents_*``)."""
    if len(value) <= MAX_ID_LENGTH:
        return value
    return "sha256-" + hashlib.sha256(value.encode()).hexdigest()


def mask(text: str, cfg: ServiceBusConfig) -> str:
    """``text`` with shared access keys and the connection string blanked."""
    if cfg.connection_string is not None:
        secret = cfg.connection_string.get_secret_value()
        text = text.replace(secret, "<connection string>")
    return _KEY.sub(lambda m: f"{m.group(1)}=***", text)


def make_client(cfg: ServiceBusConfig, **options: Any) -> Any:
    """An ``azure.servicebus.aio.ServiceBusClient`` for ``cfg``.

    :raises MissingExtraError: ``fully_qualified_namespace`` without azure-identity.
    """
    from azure.servicebus.aio import ServiceBusClient

    options.setdefault("retry_total", cfg.sdk_retry_total)
    options.setdefault("retry_backoff_factor", 0.5)
    if cfg.connection_string is not None:
        return ServiceBusClient.from_connection_string(cfg.connection_string.get_secret_value(), **options)
    try:
        from azure.identity.aio import DefaultAzureCredential
    except ImportError as exc:
        raise MissingExtraError(
            "fully_qualified_namespace needs azure-identity: pip install azure-identity (or use connection_string)"
        ) from exc
    assert cfg.fully_qualified_namespace is not None  # the validator guarantees one of the two
    return ServiceBusClient(cfg.fully_qualified_namespace, DefaultAzureCredential(), **options)
