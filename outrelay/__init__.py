"""outrelay: a transactional-outbox relay and transport gateway.

Append events in your own database transaction; the relay publishes them at
least once, in order per stream, through pluggable transports.

Everything a user's code needs is importable from here (transport authors
import from :mod:`outrelay.kit`). Names whose modules need an optional extra
or start a plugin — :class:`PostgresStore` (``outrelay[postgres]``),
:class:`Metrics`/:func:`serve_metrics`, :class:`PayloadCrypto`
(``outrelay[crypto]``), :class:`Resolver`/:class:`S3Store` (claim-check),
:func:`enable_tracing` (``outrelay[otel]``) — are loaded on first use, so
``import outrelay`` stays light and works without those extras.
"""

import importlib
from typing import TYPE_CHECKING, Any

from outrelay._version import __version__
from outrelay.core.config.config import (
    BusConfig,
    DestinationConfig,
    OutrelayConfig,
    RetryPolicy,
    RouteConfig,
    load_config,
    parse_config,
)
from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.config.registry import Registry
from outrelay.core.consumer.bus import EventBus
from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetter, ConsumerDeadLetters
from outrelay.core.consumer.inbox import Inbox
from outrelay.core.consumer.subscriber import Subscription, SubscriptionStats
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.contract.transport import (
    Capabilities,
    Delivered,
    Message,
    NotSent,
    Reader,
    Received,
    Rejected,
    RetryLater,
    SendResult,
    Transport,
    TransportConfig,
)
from outrelay.core.history.history import aread_stream, ascan, read_stream, scan
from outrelay.core.history.replay import Projection, ReplayResult, rebuild, replay, replay_many, verify_snapshot
from outrelay.core.history.upcasting import Upcasters, default_upcasters, upcast
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import (
    ConfigError,
    EventError,
    MissingExtraError,
    NotFoundError,
    OutrelayError,
    PermanentError,
    RetryableError,
    StoreError,
    StoreLockedError,
    TransportError,
    UnknownTransportError,
    UsageError,
)
from outrelay.core.model.ids import uuid7
from outrelay.core.relay.relay import Relay, RunSummary
from outrelay.core.stores.outbox import Outbox

if TYPE_CHECKING:
    from outrelay.core.stores.postgres import PostgresStore as PostgresStore
    from outrelay.plugins.claimcheck import Resolver as Resolver
    from outrelay.plugins.claimcheck import S3Store as S3Store
    from outrelay.plugins.crypto import PayloadCrypto as PayloadCrypto
    from outrelay.plugins.metrics import Metrics as Metrics
    from outrelay.plugins.metrics import serve_metrics as serve_metrics
    from outrelay.plugins.otel import enable_tracing as enable_tracing

#: names loaded on first use (see the module docstring): name -> module
_LAZY = {
    "Metrics": "outrelay.plugins.metrics",
    "PayloadCrypto": "outrelay.plugins.crypto",
    "PostgresStore": "outrelay.core.stores.postgres",
    "Resolver": "outrelay.plugins.claimcheck",
    "S3Store": "outrelay.plugins.claimcheck",
    "enable_tracing": "outrelay.plugins.otel",
    "serve_metrics": "outrelay.plugins.metrics",
}


def __getattr__(name: str) -> Any:
    """The names of :data:`_LAZY`, imported on first use. :raises AttributeError: any other name.
    :raises MissingExtraError: the module needs an extra that is not installed (its own error)."""
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'outrelay' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "BusConfig",
    "Capabilities",
    "ConfigError",
    "ConsumerDeadLetter",
    "ConsumerDeadLetters",
    "Delivered",
    "DestinationConfig",
    "Event",
    "EventBus",
    "EventError",
    "Inbound",
    "Inbox",
    "Message",
    "MissingExtraError",
    "NotFoundError",
    "NotSent",
    "Outbox",
    "OutrelayConfig",
    "OutrelayError",
    "PermanentError",
    "Projection",
    "Reader",
    "Received",
    "Registry",
    "Rejected",
    "Relay",
    "ReplayResult",
    "RetryLater",
    "RetryPolicy",
    "RetryableError",
    "RouteConfig",
    "RunSummary",
    "SendResult",
    "StoreError",
    "StoreLockedError",
    "Subscription",
    "SubscriptionBackend",
    "SubscriptionSpec",
    "SubscriptionStats",
    "Transport",
    "TransportConfig",
    "TransportError",
    "UnknownTransportError",
    "Upcasters",
    "UsageError",
    "__version__",
    "aread_stream",
    "ascan",
    "default_upcasters",
    "hookimpl",
    "load_config",
    "parse_config",
    "read_stream",
    "rebuild",
    "replay",
    "replay_many",
    "scan",
    "upcast",
    "uuid7",
    "verify_snapshot",
]
