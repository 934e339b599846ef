"""Google Cloud Pub/Sub (``pubsub``): ``pip install "outrelay[pubsub]"``.

Registering it imports nothing of ``google-cloud-pubsub``; the registry loads
``_transport`` when a destination says ``transport = "pubsub"``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin

_IMPL = "outrelay.transports.pubsub._transport:PubSubTransport"
outrelay_add_transports = transport_plugin("pubsub", _IMPL, requires=("google.cloud.pubsub_v1",), extra="pubsub")
