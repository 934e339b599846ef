"""outrelay-mqtt: an example third-party outrelay transport for MQTT 5.

Installed, it registers the ``mqtt`` transport through the ``outrelay``
entry-point group (see ``pyproject.toml``)::

    [destinations.devices]
    transport = "mqtt"
    host = "127.0.0.1"
    topic = "events/{tenant}/{type}"

It is written against :mod:`outrelay.kit` only. The wire format, outcomes
and ordering are described in :mod:`outrelay_mqtt._transport`.
"""

from __future__ import annotations

from outrelay.kit import Registry, hookimpl
from outrelay_mqtt._config import MqttConfig
from outrelay_mqtt._transport import MqttTransport

__all__ = ["MqttConfig", "MqttTransport", "outrelay_add_transports"]


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    registry.add_transport("mqtt", MqttTransport)
