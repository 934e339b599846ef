"""The ``memory`` transport plugin: a genuine in-process broker (reader and subscriptions included).

The public names are re-exported here: ``from outrelay.transports.memory import MemoryTransport``.
"""

from __future__ import annotations

from outrelay.kit import transport_plugin
from outrelay.transports.memory._broker import MemoryBroker, MemoryGroup
from outrelay.transports.memory._config import MemoryConfig
from outrelay.transports.memory._reader import MemoryReader
from outrelay.transports.memory._subscription import MemorySubscription
from outrelay.transports.memory._transport import MemoryTransport

__all__ = [
    "MemoryBroker",
    "MemoryConfig",
    "MemoryGroup",
    "MemoryReader",
    "MemorySubscription",
    "MemoryTransport",
    "outrelay_add_transports",
]

outrelay_add_transports = transport_plugin("memory", MemoryTransport)
