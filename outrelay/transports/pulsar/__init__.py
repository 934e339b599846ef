"""The ``pulsar`` transport plugin; the implementation needs ``pip install "outrelay[pulsar]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``pulsar``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "pulsar", "outrelay.transports.pulsar._transport:PulsarTransport", requires=("pulsar",), extra="pulsar"
)
