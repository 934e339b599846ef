"""outrelay's exceptions: one root, every failure classified.

::

    OutrelayError
    ├── ConfigError (ValueError)          bad config file, value or template
    │   ├── UnknownTransportError         no transport registered under that name
    │   └── MissingExtraError (ImportError)  the transport's client library is absent
    ├── EventError (ValueError)           an invalid event (empty type, bad id, data)
    ├── TransportError                    a send/open/check failed
    │   ├── RetryableError                try again later (network, throttling, 5xx)
    │   └── PermanentError                the broker rejected it; retrying will not help
    ├── StoreError                        the outbox database failed or is misused
    │   └── StoreLockedError              another relay already serves this SQLite outbox
    ├── NotFoundError (LookupError)       no such dead letter / destination
    └── UsageError (RuntimeError)         misuse of the API (send after close, ...)

Every message is one line: what failed, where, and how to fix it. Messages
never contain secrets; transports must mask credentials before raising.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "EventError",
    "MissingExtraError",
    "NotFoundError",
    "OutrelayError",
    "PermanentError",
    "RetryableError",
    "StoreError",
    "StoreLockedError",
    "TransportError",
    "UnknownTransportError",
    "UsageError",
]


class OutrelayError(Exception):
    """Root of every error outrelay raises on purpose."""


class ConfigError(OutrelayError, ValueError):
    """The configuration is invalid. ``where`` names the file/key when known."""

    def __init__(self, message: str, *, where: str | None = None) -> None:
        self.where = where
        super().__init__(f"{where}: {message}" if where else message)


class UnknownTransportError(ConfigError):
    """A destination names a transport nobody registered."""


class MissingExtraError(ConfigError, ImportError):
    """A transport's client library is not installed; the message has the pip line."""


class EventError(OutrelayError, ValueError):
    """An event is invalid (empty type, bad id, non-serialisable data, ...)."""


class TransportError(OutrelayError):
    """A transport operation failed.

    ``destination`` and ``event_id`` carry context when known. Vendor
    exceptions are chained as ``__cause__``, never raised as such.
    """

    def __init__(
        self,
        message: str,
        *,
        destination: str | None = None,
        event_id: str | None = None,
    ) -> None:
        self.destination = destination
        self.event_id = event_id
        super().__init__(message)


class RetryableError(TransportError):
    """A transient failure: sending again later may succeed.

    ``retry_after`` (seconds) is the broker's hint, if it gave one.
    """

    def __init__(
        self,
        message: str,
        *,
        retry_after: float | None = None,
        destination: str | None = None,
        event_id: str | None = None,
    ) -> None:
        self.retry_after = retry_after
        super().__init__(message, destination=destination, event_id=event_id)


class PermanentError(TransportError):
    """The broker rejected the message or the request; retrying will not help."""


class StoreError(OutrelayError):
    """The outbox database failed, or is in a state outrelay cannot use."""


class StoreLockedError(StoreError):
    """Another relay process already serves this SQLite outbox."""


class NotFoundError(OutrelayError, LookupError):
    """The named dead letter, destination or event does not exist."""


class UsageError(OutrelayError, RuntimeError):
    """The API was used wrongly (send after close, relay started twice, ...)."""
