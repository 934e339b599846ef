"""Building the ``azure.servicebus.aio`` client of the ``servicebus`` transport and opening its links.

Each sender and receiver is one AMQP connection of its own, opened within
``open_timeout`` and wrapped in a :class:`~._sockets.Guarded`, so a failed,
timed-out or cancelled open leaves no socket behind.
"""

from __future__ import annotations

from typing import Any

from azure.servicebus import ServiceBusReceiveMode
from azure.servicebus.aio import ServiceBusClient

from outrelay.kit import MissingExtraError
from outrelay.transports.servicebus._config import ServiceBusConfig
from outrelay.transports.servicebus._sockets import Guarded

__all__ = ["make_client", "open_receiver", "open_sender"]


def make_client(cfg: ServiceBusConfig, **options: Any) -> Any:
    """An ``azure.servicebus.aio.ServiceBusClient`` for ``cfg`` (it connects per sender/receiver).

    :raises MissingExtraError: ``fully_qualified_namespace`` without azure-identity.
    :raises ValueError: a malformed connection string (its text may quote it: redact).
    """
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


async def _opened(sdk: Any, cfg: ServiceBusConfig, what: str) -> Guarded:
    guarded = Guarded(sdk)
    try:
        await guarded.open(cfg.open_timeout)
    except TimeoutError:
        raise TimeoutError(
            f"no {what} attached on {cfg.endpoint} within open_timeout={cfg.open_timeout}s; check that the "
            "endpoint is reachable and answers AMQP, or raise open_timeout"
        ) from None
    return guarded


async def open_sender(client: Any, cfg: ServiceBusConfig, entity: str) -> Guarded:
    """An attached sender of queue/topic ``entity``.

    :raises TimeoutError: not attached within ``open_timeout`` (nothing left open).
    :raises Exception: the SDK's error (nothing left open).
    """
    sdk = client.get_queue_sender(entity) if cfg.queue is not None else client.get_topic_sender(entity)
    return await _opened(sdk, cfg, f"sender to {entity!r}")


async def open_receiver(
    client: Any, cfg: ServiceBusConfig, entity: str, *, subscription: str | None, session: Any, wait: float = 1.0
) -> Guarded:
    """An attached receive-and-delete receiver of ``entity`` (of ``subscription`` on a topic; of
    ``session`` when not None, e.g. ``NEXT_AVAILABLE_SESSION``, waiting at most ``wait`` seconds for
    one to be available, then ``OperationTimeoutError``). Raises as :func:`open_sender`."""
    opts: dict[str, Any] = {"receive_mode": ServiceBusReceiveMode.RECEIVE_AND_DELETE, "max_wait_time": wait}
    if session is not None:
        opts["session_id"] = session
    if subscription is not None:
        sdk = client.get_subscription_receiver(entity, subscription, **opts)
    else:
        sdk = client.get_queue_receiver(entity, **opts)
    return await _opened(sdk, cfg, f"receiver to {entity!r}")
