"""Connections of the ``rabbitmq`` transport, its reader, subscriber and check (aio-pika).

:func:`connect` opens one plain connection: the reader, the subscriber and
``check`` own theirs and start over by themselves after a loss.
:func:`connect_robust` opens the publisher's: aio-pika's robust connection
reconnects by itself (every :data:`RECONNECT_INTERVAL` seconds) and restores
its channels, telling the transport through ``on_lost(reason)`` and
``on_restored()`` (what :class:`~outrelay.kit.LifecycleTransport`'s
``connection_lost``/``connection_restored`` take).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import aio_pika
import aio_pika.abc
from yarl import URL

from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._errors import VENDOR_ERRORS, mapped

__all__ = ["RECONNECT_INTERVAL", "connect", "connect_robust"]

#: seconds between two reconnect attempts of the publisher's robust connection
RECONNECT_INTERVAL = 0.5


def _options(cfg: RabbitMQConfig, destination: str, name: str) -> dict[str, Any]:
    return {
        "ssl_context": cfg.ssl_context(),
        "timeout": cfg.connect_timeout,
        "client_properties": {"connection_name": f"{name} ({destination})"},
    }


async def connect(
    cfg: RabbitMQConfig, destination: str, name: str = "outrelay", *, heartbeat: int | None = None
) -> aio_pika.abc.AbstractConnection:
    """One plain (non-robust) connection; reconnecting is the caller's job.

    ``heartbeat`` (seconds) overrides the negotiated heartbeat: the broker
    drops a silent peer (and requeues its unacked messages) after about that long.

    :raises RetryableError: broker unreachable within ``connect_timeout``.
    :raises PermanentError: authentication or vhost refused.
    """
    extra: dict[str, Any] = {"heartbeat": heartbeat} if heartbeat else {}
    with mapped(f"cannot connect to {cfg.where}", destination, cfg.secrets()):
        return await asyncio.wait_for(
            aio_pika.connect(cfg.connection_url(), **_options(cfg, destination, name), **extra),
            timeout=cfg.connect_timeout + 1.0,
        )


async def connect_robust(
    cfg: RabbitMQConfig,
    destination: str,
    *,
    on_lost: Callable[[str], None],
    on_restored: Callable[[], None],
    name: str = "outrelay",
) -> aio_pika.abc.AbstractRobustConnection:
    """A robust connection (see the module docstring); the first connect must succeed.

    ``on_lost(reason)`` is called when the connection drops (and again when a
    reconnect attempt fails while restoring its channels), ``on_restored()``
    once it is connected again with its channels restored. Closing the
    connection calls ``on_lost`` too: the caller ignores it then.

    :raises RetryableError: broker unreachable within ``connect_timeout``.
    :raises PermanentError: authentication or vhost refused.
    """
    options = _options(cfg, destination, name)
    timeout = options.pop("timeout")
    conn = aio_pika.RobustConnection(URL(cfg.connection_url()), reconnect_interval=RECONNECT_INTERVAL, **options)
    try:
        with mapped(f"cannot connect to {cfg.where}", destination, cfg.secrets()):
            # fail_fast (aio-pika's default): a first attempt that fails raises instead of retrying
            await asyncio.wait_for(conn.connect(timeout=timeout), timeout=timeout + 1.0)
    except BaseException:
        with contextlib.suppress(*VENDOR_ERRORS, RuntimeError):  # stops its reconnect task too
            await conn.close()
        raise

    def lost(_sender: Any, exc: BaseException | None = None) -> None:
        on_lost(type(exc).__name__ if exc is not None else "closed by the broker")

    def restored(_sender: Any) -> None:
        on_restored()

    conn.close_callbacks.add(lost)
    conn.reconnect_callbacks.add(restored)
    return conn
