"""The ``servicebus`` transport plugin; the implementation needs ``pip install "outrelay[servicebus]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``servicebus``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from outrelay.core.hookspecs import hookimpl

if TYPE_CHECKING:
    from outrelay.core.registry import Registry


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    registry.add_transport(
        "servicebus",
        "outrelay.transports.servicebus._transport:ServiceBusTransport",
        requires=("azure.servicebus",),
        extra="servicebus",
    )
