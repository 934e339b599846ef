"""The ``rabbitmq`` transport plugin; the implementation needs ``pip install "outrelay[rabbitmq]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``rabbitmq``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "rabbitmq", "outrelay.transports.rabbitmq._transport:RabbitMQTransport", requires=("aio_pika",), extra="rabbitmq"
)
