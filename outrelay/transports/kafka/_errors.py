"""The one place where aiokafka exceptions become outrelay outcomes.

Per record: :func:`result_for` turns a failed send future into
:class:`RetryLater` or :class:`Rejected`. Per operation (open, metadata,
check): :func:`map_kafka_errors` re-raises as RetryableError/PermanentError.
Classification: errors that name the message or a static setup problem
(record too large, invalid topic, authorization, unsupported codec) are
permanent; everything else (connection, leader changes, timeouts, unknown
broker errors flagged retriable) is retryable, bounded by the retry policy.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from aiokafka import errors as ke

from outrelay.kit import PermanentError, Rejected, RetryableError, RetryLater, SendResult, TransportError

__all__ = ["describe", "is_permanent", "map_kafka_errors", "result_for"]

_PERMANENT: tuple[type[BaseException], ...] = (
    ke.MessageSizeTooLargeError,
    ke.RecordListTooLargeError,
    ke.InvalidTopicError,
    ke.TopicAuthorizationFailedError,
    ke.ClusterAuthorizationFailedError,
    ke.CorruptRecordException,
    ke.UnsupportedVersionError,
    ke.UnsupportedForMessageFormatError,
    ke.InvalidRequiredAcksError,
    ke.UnrecognizedBrokerVersion,
    ke.SaslAuthenticationFailed,
    ke.AuthenticationFailedError,
    ke.UnsupportedCodecError,
    ke.InvalidTimestampError,
    ke.IllegalSaslStateError,
    ke.UnsupportedSaslMechanismError,
)

_HINTS = {
    ke.MessageSizeTooLargeError: "lower max_message_bytes or raise the topic's max.message.bytes",
    ke.RecordListTooLargeError: "lower batch_bytes below the broker's message.max.bytes",
    ke.TopicAuthorizationFailedError: "grant the principal WRITE on the topic",
    ke.ClusterAuthorizationFailedError: "grant the principal IDEMPOTENT_WRITE or set enable_idempotence = false",
    ke.SaslAuthenticationFailed: "check sasl_username/sasl_password and sasl_mechanism",
    ke.UnsupportedVersionError: "the broker is too old; set enable_idempotence = false or upgrade it",
}


def describe(exc: BaseException) -> str:
    """One line naming the error and, when known, how to fix it (no secrets)."""
    name = type(exc).__name__
    text = str(exc).split("\n", 1)[0][:200]
    hint = next((h for cls, h in _HINTS.items() if isinstance(exc, cls)), None)
    if isinstance(exc, RuntimeError) and "Compression library" in text:
        hint = "pip install cramjam (aiokafka's snappy, lz4 and zstd codecs), or compression = 'gzip'"
    line = f"{name}: {text}" if text and text != name else name
    return f"{line} ({hint})" if hint else line


def is_permanent(exc: BaseException) -> bool:
    return isinstance(exc, _PERMANENT) or (isinstance(exc, RuntimeError) and "Compression library" in str(exc))


def result_for(exc: BaseException) -> SendResult:
    """The per-record outcome of a failed send future."""
    if is_permanent(exc):
        return Rejected(describe(exc))
    return RetryLater(describe(exc))


@contextmanager
def map_kafka_errors(what: str, destination: str) -> Iterator[None]:
    """Re-raise aiokafka/network errors as RetryableError or PermanentError."""
    try:
        yield
    except TransportError:
        raise
    except TimeoutError as exc:
        raise RetryableError(f"kafka {what} timed out; is the broker reachable?", destination=destination) from exc
    except Exception as exc:  # whatever the client raises becomes ours (a KeyError from its SCRAM code, ...)
        msg = f"kafka {what} failed: {describe(exc)}"
        if is_permanent(exc):
            raise PermanentError(msg, destination=destination) from exc
        raise RetryableError(msg, destination=destination) from exc
