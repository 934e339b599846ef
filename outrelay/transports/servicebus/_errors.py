"""The one error table of the ``servicebus`` transport (azure-servicebus exceptions).

``server-busy`` -> RetryLater with the ``busy_retry_after`` option
(:func:`result`); connection/timeout/not-found/quota -> RetryLater; too large
-> Rejected; credentials refused or without the Send claim -> Rejected with
``disable_destination`` (the destination stops, its events stay pending until
``outrelay enable``; from ``open``/``check`` one PermanentError line); an
AMQP condition saying the message will never be accepted, or a field the SDK
refuses -> Rejected; anything else -> RetryLater (never dead-letter on a
guess). Messages are redacted (``SharedAccessKey``, SAS ``sig``), and the
boundary does not chain the SDK's exception, whose text may quote the
connection string.
"""

from __future__ import annotations

from azure.servicebus import exceptions as sbe

from outrelay.kit import DisablingErrorMap, RetryLater, SendResult
from outrelay.transports.servicebus._config import ServiceBusConfig

__all__ = ["ERRORS", "result"]

#: AMQP conditions that say "this message will never be accepted".
_PERMANENT_CONDITIONS = ("amqp:not-allowed", "amqp:invalid-field", "amqp:decode-error", "amqp:precondition-failed")
_REFUSED = (sbe.ServiceBusAuthenticationError, sbe.ServiceBusAuthorizationError)


def _never_accepted(exc: BaseException) -> bool:
    return isinstance(exc, sbe.ServiceBusError) and any(c in str(exc) for c in _PERMANENT_CONDITIONS)


ERRORS = DisablingErrorMap(
    (sbe.ServiceBusServerBusyError, "retry", "Service Bus is busy"),
    (sbe.MessageSizeExceededError, "reject", "message too large for the entity"),
    (sbe.MessagingEntityNotFoundError, "retry", "entity not found (create it or fix the queue/topic option)"),
    (
        _REFUSED,
        "reject",
        "not allowed to send (needs the Send claim; fix the connection string, then `outrelay enable` the destination)",
    ),
    (
        (sbe.ServiceBusQuotaExceededError, sbe.MessagingEntityDisabledError),
        "retry",
        "entity cannot take messages now",
    ),
    (
        (sbe.ServiceBusConnectionError, sbe.ServiceBusCommunicationError, sbe.OperationTimeoutError),
        "retry",
        "Service Bus unreachable",
    ),
    (TimeoutError, "retry", "not confirmed in time"),
    (_never_accepted, "reject", "Service Bus refused the message"),
    ((ValueError, TypeError), "reject", "invalid message"),
    disable=_REFUSED,
    chain=False,
)


def result(exc: BaseException, cfg: ServiceBusConfig, what: str = "") -> SendResult:
    """The per-message outcome of ``exc`` (``ERRORS``), suggesting ``busy_retry_after`` after server-busy."""
    r = ERRORS.result(exc, what)
    if isinstance(exc, sbe.ServiceBusServerBusyError) and isinstance(r, RetryLater):
        return RetryLater(r.error, cfg.busy_retry_after)
    return r
