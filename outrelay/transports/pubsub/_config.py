"""Config model of the ``pubsub`` transport and its client construction.

The emulator is reached through ``emulator_host`` (an insecure gRPC channel
to that address, anonymous credentials) instead of the process-wide
``PUBSUB_EMULATOR_HOST`` variable, so two destinations in one process can
use different endpoints. Without ``emulator_host`` the client uses
``credentials_file`` (a service-account JSON) or Application Default
Credentials.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from outrelay.kit import TransportConfig

__all__ = ["PubSubConfig", "make_publisher", "make_subscriber"]

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

    def topic_path(self, topic: str) -> str:
        return topic if topic.startswith("projects/") else f"projects/{self.project}/topics/{topic}"

    def subscription_path(self, name: str) -> str:
        return name if name.startswith("projects/") else f"projects/{self.project}/subscriptions/{name}"


def _client_kwargs(cfg: PubSubConfig, transport_cls: Any) -> dict[str, Any]:
    if cfg.emulator_host:
        import grpc  # type: ignore[import-untyped]

        # unlimited like the library's own channels (gRPC's default caps receives at 4 MB)
        options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
        channel = grpc.insecure_channel(cfg.emulator_host, options=options)
        return {"transport": transport_cls(channel=channel)}
    if cfg.credentials_file:
        from google.oauth2 import service_account

        creds = service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
            cfg.credentials_file
        )
        return {"credentials": creds}
    return {}


def make_publisher(cfg: PubSubConfig) -> Any:
    """A ``PublisherClient`` for ``cfg``.

    :raises google.auth.exceptions.DefaultCredentialsError: no credentials
        found (the caller maps it).
    """
    from google.cloud import pubsub_v1
    from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

    batch = pubsub_v1.types.BatchSettings(
        max_bytes=cfg.max_batch_bytes, max_latency=cfg.max_latency, max_messages=cfg.max_messages
    )
    options = pubsub_v1.types.PublisherOptions(
        enable_message_ordering=cfg.ordering,
        # retry=None: one RPC attempt; failures go back to the relay, whose
        # backoff (with jitter, per stream) replaces the library's.
        **({} if cfg.sdk_retry else {"retry": None}),
        timeout=cfg.publish_timeout,
    )
    return pubsub_v1.PublisherClient(
        batch_settings=batch, publisher_options=options, **_client_kwargs(cfg, PublisherGrpcTransport)
    )


def make_subscriber(cfg: PubSubConfig) -> Any:
    """A ``SubscriberClient`` for ``cfg`` (readers and provisioning)."""
    from google.cloud import pubsub_v1
    from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

    return pubsub_v1.SubscriberClient(**_client_kwargs(cfg, SubscriberGrpcTransport))
