"""The ``kafka`` transport plugin; the implementation needs ``pip install "outrelay[kafka]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``kafka``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "kafka", "outrelay.transports.kafka._transport:KafkaTransport", requires=("aiokafka",), extra="kafka"
)
