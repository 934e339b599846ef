"""The one place where redis-py exceptions become outrelay outcomes: the table :data:`ERRORS`.

Transient conditions (connection loss, timeouts, loading, OOM, read-only
replica after a failover, cluster redirections and TRYAGAIN, CLUSTERDOWN, an
uncovered slot, a cluster with no reachable node) are retryable; errors about
the command or the key (WRONGTYPE, NOPERM, syntax, CROSSSLOT) and failed
authentication are permanent.

redis-py strips the error code off the message of the errors it has a class
for (``MovedError("3999 127.0.0.1:7001")``, ``status_code="MOVED"``): the code
is read from ``status_code`` and put back in front of the text.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from redis import exceptions as rx
from redis.exceptions import RedisClusterException

from outrelay.kit import ErrorMap, Rule, SendResult, certificate_refused, redact, tls_hint

__all__ = ["ERRORS", "describe", "is_permanent", "map_redis_errors", "reply_result", "result_for"]

_TRANSIENT_PREFIXES = (
    "OOM",
    "LOADING",
    "BUSY",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "MASTERDOWN",
    "READONLY",
    "MOVED",
    "ASK",
    "NOREPLICAS",
    "NOSCRIPT",  # a node without the script (promoted replica): loaded again on the next attempt
)
_HINTS = {
    "WRONGTYPE": "the key exists and is not a stream; pick another `stream` template or delete the key",
    "NOPERM": "grant the ACL user +xadd on the stream keys (e.g. ACL SETUSER relay ~events:* +xadd)",
    "WRONGPASS": "check username/password",
}


def describe(exc: BaseException) -> str:
    """One line naming the error and, when known, how to fix it (no secrets)."""
    refused = certificate_refused(exc)
    if refused is not None:
        return tls_hint(refused, "ssl_ca_certs")
    text = str(exc).split("\n", 1)[0][:200] or type(exc).__name__
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code and not text.startswith(code):
        text = f"{code} {text}"
    hint = next((h for p, h in _HINTS.items() if text.startswith(p) or p in text[:40]), None)
    if isinstance(exc, rx.NoPermissionError):  # redis-py strips the NOPERM prefix
        hint = _HINTS["NOPERM"]
    return f"{text} ({hint})" if hint else text


def _transient_reply(exc: BaseException) -> bool:
    """An error reply of a condition that passes (see the module docstring)."""
    if not isinstance(exc, rx.ResponseError):
        return False
    code = getattr(exc, "status_code", None)
    return (code if isinstance(code, str) and code else str(exc)).upper().startswith(_TRANSIENT_PREFIXES)


def _bad_call(exc: BaseException) -> bool:
    return isinstance(exc, rx.CrossSlotTransactionError) or "same key slot" in str(exc)


class _RedisErrors(ErrorMap):
    """An :class:`~outrelay.kit.ErrorMap` whose messages are :func:`describe`'s (the reply's own code and
    the fix for the ones users get wrong)."""

    __slots__ = ()

    def message(self, exc: BaseException, what: str = "") -> str:
        return redact(": ".join(p for p in (what, describe(exc)) if p))


#: every redis-py/network failure: retryable or permanent (the first matching rule wins; unknown: retry)
ERRORS = _RedisErrors(
    Rule(lambda e: certificate_refused(e) is not None, "reject"),
    Rule((rx.AuthenticationError, rx.AuthorizationError, rx.NoPermissionError, rx.DataError), "reject"),
    Rule(_transient_reply, "retry"),
    Rule(rx.ResponseError, "reject"),  # WRONGTYPE, NOPERM, syntax, CROSSSLOT: about the command or the key
    Rule(lambda e: isinstance(e, RedisClusterException) and _bad_call(e), "reject"),
    Rule((rx.RedisError, RedisClusterException, OSError, TimeoutError), "retry"),  # connection, slot map rebuilt
)


def is_permanent(exc: BaseException) -> bool:
    return ERRORS.kind(exc) == "reject"


def result_for(exc: BaseException) -> SendResult:
    """The per-command outcome of a failed XADD in a pipeline."""
    return ERRORS.result(exc)


def reply_result(message: str) -> SendResult:
    """The outcome of an error reply given as text (from inside a script)."""
    return result_for(rx.ResponseError(message))


@contextmanager
def map_redis_errors(what: str, destination: str) -> Iterator[None]:
    """Re-raise redis-py/network errors as RetryableError or PermanentError (by :data:`ERRORS`)."""
    with ERRORS.boundary(f"redis {what} failed", destination=destination):
        yield
