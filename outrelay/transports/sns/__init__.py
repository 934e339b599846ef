"""The ``sns`` transport plugin; the implementation needs ``pip install "outrelay[sns]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``sns``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "sns", "outrelay.transports.sns._transport:SNSTransport", requires=("boto3",), extra="sns"
)
