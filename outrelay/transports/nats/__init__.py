"""The ``nats`` transport plugin; the implementation needs ``pip install "outrelay[nats]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``nats``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "nats", "outrelay.transports.nats._transport:NatsTransport", requires=("nats",), extra="nats"
)
