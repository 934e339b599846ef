"""The ``redis`` transport plugin; the implementation needs ``pip install "outrelay[redis]"``.

Importing this package never imports the client library: the registry
loads ``_transport.py`` only when a destination uses ``redis``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

outrelay_add_transports = transport_plugin(
    "redis", "outrelay.transports.redis._transport:RedisTransport", requires=("redis",), extra="redis"
)
