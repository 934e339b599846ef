"""The ``servicebus`` transport plugin; the implementation needs ``pip install "outrelay[servicebus]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``servicebus``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "servicebus",
    "outrelay.transports.servicebus._transport:ServiceBusTransport",
    requires=("azure.servicebus",),
    extra="servicebus",
)
