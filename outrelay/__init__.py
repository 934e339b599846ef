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
from outrelay.core.hookspecs import hookimpl
from outrelay.core.ids import uuid7
from outrelay.core.inbox import Inbox
from outrelay.core.outbox import Outbox
from outrelay.core.registry import Registry
from outrelay.core.relay import Relay, RunSummary
from outrelay.core.subscriber import Subscription, SubscriptionStats
from outrelay.core.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.transport import (
    Capabilities,
    Delivered,
    Message,
    Reader,
    Received,
    Rejected,
    RetryLater,
    SendResult,
    Transport,
    TransportConfig,
)

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
    "Outbox",
    "OutrelayConfig",
    "OutrelayError",
    "PermanentError",
    "Reader",
    "Received",
    "Registry",
    "Rejected",
    "Relay",
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
    "UsageError",
    "__version__",
    "hookimpl",
    "load_config",
    "parse_config",
    "uuid7",
]
