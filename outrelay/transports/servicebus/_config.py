"""Config model of the ``servicebus`` transport (the client is built in ``_client``).

Two ways to authenticate, exactly one of them:

* ``connection_string`` (a :class:`~pydantic.SecretStr`: never printed;
  ``SharedAccessKey`` and SAS signatures are masked in every error message
  by :func:`outrelay.kit.redact`);
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

import re

from pydantic import Field, SecretStr, model_validator

from outrelay.kit import TransportConfig

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "ServiceBusConfig"]

#: Standard tier's 256 KiB per message, less room for the ``cloudEvents_*``
#: application properties and the AMQP envelope.
DEFAULT_MAX_MESSAGE_BYTES = 256 * 1024 - 16 * 1024


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
    def entity_option(self) -> str:
        """``"queue"`` or ``"topic"``: the option holding the target template."""
        return "queue" if self.queue is not None else "topic"

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
