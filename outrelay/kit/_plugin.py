"""Registering a transport: the one hook a transport plugin implements, in one line."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from outrelay.core.config.hookspecs import hookimpl

if TYPE_CHECKING:
    from outrelay.core.config.registry import Registry
    from outrelay.core.contract.transport import Transport

__all__ = ["transport_plugin"]


def transport_plugin(
    name: str, target: type[Transport] | str, *, requires: tuple[str, ...] = (), extra: str | None = None
) -> Callable[[Registry], None]:
    """The ``outrelay_add_transports`` hook implementation that registers one transport.

    A plugin module (the target of an entry point in the group ``outrelay``)
    binds it under the hook's name::

        outrelay_add_transports = transport_plugin(
            "mqtt", "outrelay_mqtt._transport:MqttTransport", requires=("paho.mqtt",)
        )

    ``target`` is the class or a ``"module:Class"`` path, imported only when a
    destination uses the transport; ``requires`` names the client modules it
    needs and ``extra`` the ``outrelay[extra]`` that installs them (the error
    for a missing one says ``pip install "outrelay[extra]"``).
    """

    @hookimpl
    def outrelay_add_transports(registry: Registry) -> None:
        registry.add_transport(name, target, requires=requires, extra=extra)

    return outrelay_add_transports
