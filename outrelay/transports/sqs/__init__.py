"""The ``sqs`` transport plugin; the implementation needs ``pip install "outrelay[sqs]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``sqs``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "sqs", "outrelay.transports.sqs._transport:SQSTransport", requires=("boto3",), extra="sqs"
)
