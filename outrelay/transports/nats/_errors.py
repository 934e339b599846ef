"""The one place where nats-py exceptions become outrelay's.

:func:`classify` decides retryable vs permanent and writes the message;
:func:`result_for` turns it into a per-message result and :func:`mapped` is
the context manager for whole operations (open, check, reader), raising
:class:`~outrelay.RetryableError` / :class:`~outrelay.PermanentError`
``from`` the vendor exception.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from contextlib import contextmanager

import nats.errors
import nats.js.errors

from outrelay.kit import PermanentError, Rejected, RetryableError, RetryLater, SendResult

__all__ = ["PublishDenied", "classify", "denied_subject", "is_auth_error", "mapped", "result_for"]

# JetStream API error codes (err_code) that no retry can fix.
_PERMANENT_CODES = {
    10060: "the subject is bound to another stream than expected_stream",
    10054: "the message is larger than the stream's max_msg_size",
}
# Resource limits that may clear (consumers ack, retention removes old messages).
_RETRYABLE_CODES = {
    10077: "the stream is full (max_msgs/max_bytes with discard=new)",
    10176: "the atomic batch was abandoned as incomplete (a message of it lost on the way, e.g. in a stream leader "
    "change): nothing of it was stored; retried",
    10070: "order guard: an earlier message to this stream was not stored (lost in a stream leader change, "
    "refused, or another publisher wrote in between), so this one was held back; retried in order",
}


# nats-py lower-cases the server's -ERR text: 'permissions violation for publish to "orders.x"'
_PUBLISH_DENIED = re.compile(r'permissions violation for publish to "?([^"\s]+)"?')


class PublishDenied(nats.errors.Error):
    """The server refused a publish: the connection's user may not publish to ``subject``."""

    def __init__(self, subject: str) -> None:
        super().__init__(subject)
        self.subject = subject

    def __str__(self) -> str:
        return f"nats: permissions violation for publish to {self.subject!r}"


def denied_subject(exc: BaseException) -> str | None:
    """The subject of a "permissions violation for publish" the server reported
    asynchronously (nats-py hands it to ``error_cb``; lower-cased), else None."""
    if not isinstance(exc, nats.errors.Error):
        return None
    m = _PUBLISH_DENIED.search(str(exc))
    return m.group(1) if m else None


def is_auth_error(exc: BaseException) -> bool:
    """The server refused our credentials (nats-py reports it as a plain Error during connect)."""
    return isinstance(exc, nats.errors.AuthorizationError) or (
        isinstance(exc, nats.errors.Error) and "authorization violation" in str(exc).lower()
    )


def classify(exc: BaseException, subject: str | None = None) -> tuple[bool, str]:
    """``(retryable, message)`` for a nats-py exception (or an asyncio timeout)."""
    on = f" on subject {subject!r}" if subject else ""
    if isinstance(exc, nats.js.errors.NoStreamResponseError | nats.errors.NoRespondersError):
        return True, (
            f"no JetStream stream answered{on} (no responders): create a stream whose subjects cover it "
            "(or set create_stream), or check that JetStream is enabled"
        )
    if isinstance(exc, nats.js.errors.APIError):
        code = exc.err_code or 0
        text = f"JetStream error {exc.code}/{code}{on}: {exc.description or 'no description'}"
        if code in _PERMANENT_CODES:
            return False, f"{text} ({_PERMANENT_CODES[code]})"
        if code in _RETRYABLE_CODES:
            return True, f"{text} ({_RETRYABLE_CODES[code]})"
        return (exc.code is None or exc.code >= 500 or exc.code in (408, 429)), text
    if isinstance(exc, nats.errors.BadSubjectError):
        return False, f"invalid subject {subject!r}: use dot-separated tokens without spaces or wildcards"
    if isinstance(exc, nats.errors.MaxPayloadError):
        return False, f"message exceeds the server's max_payload{on}"
    if is_auth_error(exc):
        return False, "authorization violation: check credentials and the account's publish permissions"
    if isinstance(exc, PublishDenied):
        return False, (
            f"permission denied: the server refused a publish to {exc.subject!r}; grant this user publish "
            "permission on the subject (server authorization), or use credentials that have it"
        )
    if isinstance(exc, nats.errors.TimeoutError | asyncio.TimeoutError | nats.js.errors.TooManyStalledMsgsError):
        return True, f"no JetStream ack in time{on} (server slow, restarting or unreachable)"
    if isinstance(exc, nats.errors.NoServersError | ConnectionError | OSError):
        return True, f"cannot reach a NATS server: {type(exc).__name__}"
    if isinstance(exc, nats.errors.Error):
        # closed/draining/reconnecting connection, stale connection, buffer full
        return True, f"NATS connection problem{on}: {type(exc).__name__}"
    return True, f"unexpected {type(exc).__name__}{on}"


def result_for(exc: BaseException, subject: str) -> SendResult:
    retryable, message = classify(exc, subject)
    return RetryLater(message) if retryable else Rejected(message)


@contextmanager
def mapped(what: str, destination: str) -> Iterator[None]:
    """Raise outrelay errors for vendor failures of ``what`` (e.g. "connect to nats://h:4222")."""
    try:
        yield
    except (TimeoutError, nats.errors.Error, OSError) as exc:
        retryable, message = classify(exc)
        cls = RetryableError if retryable else PermanentError
        raise cls(f"{what}: {message}", destination=destination) from exc
