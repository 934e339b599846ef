"""Building and connecting the ``google-cloud-pubsub`` clients of the ``pubsub`` transport.

Every function here blocks (gRPC): callers run them in a thread
(``asyncio.to_thread``). Nothing is retried here; failures are the
library's exceptions, mapped by the caller through ``_errors.ERRORS``.
"""

from __future__ import annotations

import contextlib
from typing import Any

from google.cloud import pubsub_v1
from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport
from google.pubsub_v1.services.subscriber.transports import SubscriberGrpcTransport

from outrelay.transports.pubsub._config import PubSubConfig

__all__ = ["make_publisher", "make_subscriber", "stop_publisher", "wait_ready"]


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
    """A ``PublisherClient`` for ``cfg`` (not connected yet: see :func:`wait_ready`).

    :raises google.auth.exceptions.DefaultCredentialsError: no credentials found.
    """
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
    return pubsub_v1.SubscriberClient(**_client_kwargs(cfg, SubscriberGrpcTransport))


def wait_ready(client: Any, cfg: PubSubConfig) -> None:
    """Block until the client's gRPC channel is connected.

    :raises TimeoutError: not connected within ``cfg.open_timeout`` (the
        message names the endpoint).
    """
    import grpc

    try:
        grpc.channel_ready_future(client.transport.grpc_channel).result(timeout=cfg.open_timeout)
    except grpc.FutureTimeoutError as exc:
        raise TimeoutError(f"Pub/Sub endpoint {cfg.endpoint} did not answer within {cfg.open_timeout}s") from exc


def stop_publisher(client: Any) -> None:
    """Flush and stop ``client``, then close its channel; raises nothing (nothing is confirmed after close).

    ``stop()`` joins the library's threads and the channel close waits on
    gRPC's: call it from a thread, never on the event loop.
    """
    with contextlib.suppress(Exception):
        client.stop()
    with contextlib.suppress(Exception):
        client.transport.close()
