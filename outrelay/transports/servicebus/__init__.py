"""Azure Service Bus queues and topics over AMQP 1.0 (``servicebus``): ``pip install "outrelay[servicebus]"``.

Importing this package leaves ``azure-servicebus`` unimported until a destination uses it.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

_IMPL = "outrelay.transports.servicebus._transport:ServiceBusTransport"
outrelay_add_transports = transport_plugin("servicebus", _IMPL, requires=("azure.servicebus",), extra="servicebus")
