"""The one place where nats-py exceptions become outrelay's: :data:`ERRORS`, one :class:`~outrelay.kit.ErrorMap`.

:data:`ERRORS` is :class:`~outrelay.transports.nats._transport.NatsTransport`'s
``errors`` (so the kit maps whatever escapes open/send/close/check with it);
:func:`result_for` is its per-message result (RetryLater / Rejected),
:func:`mapped` its whole-operation boundary (RetryableError / PermanentError
``from`` the vendor exception) for the reader, the subscriptions and the
check, and :func:`classify` the ``(retryable, message)`` pair for a log line.
Messages are redacted (``kit.redact``: URL credentials, ``token=`` values).

Retrying cannot fix a JetStream refusal with a 4xx code other than 408/429
(wrong stream, too large, ...), an invalid subject, a payload over the
server's ``max_payload``, refused credentials or a publish permission
violation: those reject. No responders (no stream, JetStream not ready), a
full ``discard = new`` stream, an abandoned atomic batch, an order-guard
refusal, timeouts and every connection problem retry, as does anything
unknown.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from contextlib import AbstractContextManager

import nats.errors
import nats.js.errors

from outrelay.kit import ErrorMap, Rule, SendResult

__all__ = ["ERRORS", "PublishDenied", "classify", "denied_subject", "is_auth_error", "mapped", "result_for"]


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


def _api(code: int) -> Callable[[BaseException], bool]:
    """Matches a JetStream API error with error code ``code``."""
    return lambda e: isinstance(e, nats.js.errors.APIError) and e.err_code == code


def _api_transient(exc: BaseException) -> bool:
    """A JetStream API error whose status says "try again" (5xx, 408, 429, none)."""
    return isinstance(exc, nats.js.errors.APIError) and (exc.code is None or exc.code >= 500 or exc.code in (408, 429))


_TIMEOUTS = (nats.errors.TimeoutError, asyncio.TimeoutError, nats.js.errors.TooManyStalledMsgsError)

#: the transport's error table (see the module docstring); first match wins
ERRORS = ErrorMap(
    (
        (nats.js.errors.NoStreamResponseError, nats.errors.NoRespondersError),
        "retry",
        "no JetStream stream answered (no responders): create a stream whose subjects cover it "
        "(or set create_stream), or check that JetStream is enabled",
    ),
    (_api(10060), "reject", "the subject is bound to another stream than expected_stream"),
    (_api(10054), "reject", "the message is larger than the stream's max_msg_size"),
    (_api(10077), "retry", "the stream is full (max_msgs/max_bytes with discard=new)"),
    (
        _api(10176),
        "retry",
        "the atomic batch was abandoned as incomplete (a message of it lost on the way, e.g. in a stream "
        "leader change): nothing of it was stored; retried",
    ),
    (
        _api(10070),
        "retry",
        "order guard: an earlier message to this stream was not stored (lost in a stream leader change, "
        "refused, or another publisher wrote in between), so this one was held back; retried in order",
    ),
    (_api_transient, "retry", "JetStream error"),
    (nats.js.errors.APIError, "reject", "JetStream refused it"),
    (nats.errors.BadSubjectError, "reject", "invalid subject: use dot-separated tokens without spaces or wildcards"),
    (nats.errors.MaxPayloadError, "reject", "message exceeds the server's max_payload"),
    (is_auth_error, "reject", "authorization violation: check credentials and the account's publish permissions"),
    (
        PublishDenied,
        "reject",
        "permission denied: grant this user publish permission on the subject (server authorization), "
        "or use credentials that have it",
    ),
    (_TIMEOUTS, "retry", "no JetStream ack in time (server slow, restarting or unreachable)"),
    ((nats.errors.NoServersError, ConnectionError, OSError), "retry", "cannot reach a NATS server"),
    # closed/draining/reconnecting connection, stale connection, buffer full
    Rule(nats.errors.Error, "retry", "NATS connection problem"),
)


def _on(subject: str | None) -> str:
    return f"subject {subject!r}" if subject else ""


def classify(exc: BaseException, subject: str | None = None) -> tuple[bool, str]:
    """``(retryable, message)`` for a nats-py exception (or an asyncio timeout), by :data:`ERRORS`."""
    return ERRORS.kind(exc) == "retry", ERRORS.message(exc, _on(subject))


def result_for(exc: BaseException, subject: str) -> SendResult:
    """The per-message result for ``exc`` publishing to ``subject`` (RetryLater or Rejected)."""
    return ERRORS.result(exc, _on(subject))


def mapped(what: str, destination: str) -> AbstractContextManager[None]:
    """Raise RetryableError/PermanentError (``from`` the vendor exception) for failures of ``what``."""
    return ERRORS.boundary(what, destination=destination)
