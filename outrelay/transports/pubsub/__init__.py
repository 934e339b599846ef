"""The ``pubsub`` transport plugin; the implementation needs ``pip install "outrelay[pubsub]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``pubsub``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "pubsub",
    "outrelay.transports.pubsub._transport:PubSubTransport",
    requires=("google.cloud.pubsub_v1",),
    extra="pubsub",
)
