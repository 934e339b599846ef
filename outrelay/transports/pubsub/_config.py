"""Config model of the ``pubsub`` transport (the clients are built in ``_client``).

The emulator is reached through ``emulator_host`` (an insecure gRPC channel
to that address, anonymous credentials) instead of the process-wide
``PUBSUB_EMULATOR_HOST`` variable, so two destinations in one process can
use different endpoints. Without ``emulator_host`` the client uses
``credentials_file`` (a service-account JSON) or Application Default
Credentials.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from outrelay.kit import TransportConfig

__all__ = ["SERVER_REQUEST_LIMIT", "PubSubConfig"]

#: Pub/Sub accepts publish requests of at most 10,000,000 bytes (data, attributes, key).
SERVER_REQUEST_LIMIT = 10_000_000


class PubSubConfig(TransportConfig):
    """Options of a ``pubsub`` destination.

    * ``project`` / ``topic``: the topic id template (``"{type}"``) inside
      ``project``; a rendered value starting with ``projects/`` is used as a
      full topic path.
    * ``ordering``: publish with ``ordering_key = stream`` (the subscription
      must have message ordering enabled for consumers to see the order).
    * ``max_messages`` / ``max_batch_bytes`` / ``max_latency``: the client's
      batch settings (one Publish RPC per batch and ordering key).
    * ``max_message_bytes``: the largest event data accepted; larger is Rejected.
      The default leaves room for attributes inside the 10 MB request limit.
    * ``publish_timeout``: bound, in seconds, on one send waiting for its publishes.
    * ``sdk_retry``: let the client library retry transient RPC errors itself.
      Off by default: with ordering enabled the library would retry for ever
      and a throttled send would never return; the relay's backoff applies instead.
    * ``open_timeout``: bound on connecting in ``open``/``check``.
    """

    project: str = Field(min_length=1)
    topic: str = "{type}"
    ordering: bool = True
    emulator_host: str | None = None
    credentials_file: str | None = None
    max_messages: int = Field(1000, ge=1, le=1000)
    max_batch_bytes: int = Field(9_000_000, ge=1024, le=SERVER_REQUEST_LIMIT)
    max_latency: float = Field(0.005, ge=0.0, le=10.0)
    max_message_bytes: int = Field(9_500_000, ge=1, le=SERVER_REQUEST_LIMIT)
    publish_timeout: float = Field(60.0, gt=0)
    sdk_retry: bool = False
    open_timeout: float = Field(5.0, gt=0)

    @field_validator("emulator_host")
    @classmethod
    def _host_port(cls, value: str | None) -> str | None:
        if value is not None and ":" not in value:
            raise ValueError("emulator_host must be HOST:PORT, e.g. 127.0.0.1:8085")
        return value

    @property
    def endpoint(self) -> str:
        """Where the publisher connects (for messages)."""
        return self.emulator_host or "pubsub.googleapis.com"

    def topic_path(self, topic: str) -> str:
        return topic if topic.startswith("projects/") else f"projects/{self.project}/topics/{topic}"

    def subscription_path(self, name: str) -> str:
        return name if name.startswith("projects/") else f"projects/{self.project}/subscriptions/{name}"
