"""The one table where aiokafka exceptions become outrelay outcomes: :data:`ERRORS`.

``ERRORS.result(exc)`` turns a failed record batch into :class:`RetryLater` or
:class:`Rejected`; ``ERRORS.boundary(what)`` (the transport's ``errors``, used
by the kit around open/send/close/check, and by the reader and subscription)
re-raises as RetryableError/PermanentError. Classification: errors that name
the message or a static setup problem (record too large, invalid topic,
authorization, unsupported codec or version, refused SASL login) are
permanent; everything else (connection, leader changes, timeouts, unknown
broker errors flagged retriable) is retryable, bounded by the retry policy.
Messages are one line with the fix where it is known, secrets masked.
"""

from __future__ import annotations

from aiokafka import errors as ke

from outrelay.kit import ErrorMap

__all__ = ["ERRORS", "describe"]


def _missing_codec(exc: BaseException) -> bool:
    return isinstance(exc, RuntimeError) and "Compression library" in str(exc)


ERRORS = ErrorMap(
    (ke.MessageSizeTooLargeError, "reject", "lower max_message_bytes or raise the topic's max.message.bytes"),
    (ke.RecordListTooLargeError, "reject", "lower batch_bytes below the broker's message.max.bytes"),
    (ke.TopicAuthorizationFailedError, "reject", "grant the principal WRITE on the topic"),
    (
        ke.ClusterAuthorizationFailedError,
        "reject",
        "grant the principal IDEMPOTENT_WRITE or set enable_idempotence = false",
    ),
    (ke.SaslAuthenticationFailed, "reject", "check sasl_username/sasl_password and sasl_mechanism"),
    (ke.UnsupportedVersionError, "reject", "the broker is too old; set enable_idempotence = false or upgrade it"),
    (
        _missing_codec,
        "reject",
        "pip install cramjam (aiokafka's snappy, lz4 and zstd codecs), or compression = 'gzip'",
    ),
    (
        (
            ke.InvalidTopicError,
            ke.CorruptRecordException,
            ke.UnsupportedForMessageFormatError,
            ke.InvalidRequiredAcksError,
            ke.UnrecognizedBrokerVersion,
            ke.AuthenticationFailedError,
            ke.UnsupportedCodecError,
            ke.InvalidTimestampError,
            ke.IllegalSaslStateError,
            ke.UnsupportedSaslMechanismError,
        ),
        "reject",
    ),
    (TimeoutError, "retry", "timed out; is the broker reachable?"),
)


def describe(exc: BaseException) -> str:
    """One line naming ``exc`` and, when known, how to fix it (no secrets)."""
    return ERRORS.message(exc)
