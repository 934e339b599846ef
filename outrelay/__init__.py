"""outrelay: a transactional-outbox relay and transport gateway.

Append events in your own database transaction; the relay publishes them at
least once, in order per stream, through pluggable transports.
"""

from outrelay._version import __version__
from outrelay.core.bus import EventBus
from outrelay.core.config import (
    BusConfig,
    DestinationConfig,
    OutrelayConfig,
    RetryPolicy,
    RouteConfig,
    load_config,
    parse_config,
)
from outrelay.core.consumer_dlq import ConsumerDeadLetter, ConsumerDeadLetters
from outrelay.core.envelope import Event
from outrelay.core.errors import (
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
from outrelay.core.history import read_stream, scan
from outrelay.core.hookspecs import hookimpl
from outrelay.core.ids import uuid7
from outrelay.core.inbox import Inbox
from outrelay.core.outbox import Outbox
from outrelay.core.registry import Registry
from outrelay.core.relay import Relay, RunSummary
from outrelay.core.replay import Projection, ReplayResult, rebuild, replay, replay_many
from outrelay.core.subscriber import Subscription, SubscriptionStats
from outrelay.core.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.transport import (
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
from outrelay.core.upcasting import Upcasters, default_upcasters, upcast

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
]
