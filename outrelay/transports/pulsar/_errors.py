"""The one table where ``pulsar-client`` failures become outrelay outcomes: :data:`ERRORS`, and
:func:`outcome` for the result codes of ``send_async`` callbacks.

Permanent (retrying the same message cannot help): the message is too big
or invalid, the topic name is invalid or the topic terminated, the schema is
incompatible, the operation is not allowed, the credentials are refused or
may not produce (retrying would go on for ever: the conformance suite's
rule; ``open`` then fails with one line, and a send is Rejected with
``disable_destination``: the destination stops and its events stay pending
until an operator fixes the credentials and runs ``outrelay enable``).
The client validates arguments with ``ValueError``/``TypeError``: permanent
too. Everything else — timeouts, connection errors, full queues — is retryable.
"""

from __future__ import annotations

from typing import Any

import pulsar

from outrelay.kit import Delivered, ErrorMap, Rejected, RetryLater, SendResult

__all__ = ["DENIED", "ERRORS", "PERMANENT", "outcome"]

PERMANENT = frozenset(
    {
        "MessageTooBig",
        "InvalidMessage",
        "InvalidTopicName",
        "TopicTerminated",
        "IncompatibleSchema",
        "NotAllowedError",
        "OperationNotSupported",
        "InvalidConfiguration",
        "InvalidUrl",
        "CryptoError",
        "AuthenticationError",
        "AuthorizationError",
    }
)
#: refusals of who is asking, not of the message: stop the destination rather than dead-letter its events
DENIED = frozenset({"AuthenticationError", "AuthorizationError"})
_DENIED_HINT = "fix the token/credentials or grant produce permission"


def _named(names: frozenset[str]) -> Any:
    return lambda exc: isinstance(exc, pulsar.PulsarException) and type(exc).__name__ in names


ERRORS = ErrorMap(
    (_named(DENIED), "reject", _DENIED_HINT),
    (_named(PERMANENT), "reject"),
    ((ValueError, TypeError), "reject"),
)


def outcome(result: Any) -> SendResult:
    """The per-message outcome of a ``send_async`` callback's ``pulsar.Result``."""
    if result == pulsar.Result.Ok:
        return Delivered()
    name = str(result).rsplit(".", 1)[-1]
    if name in DENIED:
        return Rejected(
            f"pulsar: {name}: {_DENIED_HINT}, then `outrelay enable` the destination", disable_destination=True
        )
    if name in PERMANENT:
        return Rejected(f"pulsar: {name}")
    return RetryLater(f"pulsar: {name}")
