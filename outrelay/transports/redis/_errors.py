"""The one place where redis-py exceptions become outrelay outcomes.

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

from outrelay.kit import (
    PermanentError,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    TransportError,
    certificate_refused,
    tls_hint,
)

__all__ = ["describe", "is_permanent", "map_redis_errors", "reply_result", "result_for"]

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


def is_permanent(exc: BaseException) -> bool:
    if certificate_refused(exc) is not None:
        return True
    if isinstance(exc, rx.AuthenticationError | rx.AuthorizationError | rx.NoPermissionError | rx.DataError):
        return True
    if isinstance(exc, rx.ResponseError):
        code = getattr(exc, "status_code", None)
        return not (code if isinstance(code, str) and code else str(exc)).upper().startswith(_TRANSIENT_PREFIXES)
    if isinstance(exc, RedisClusterException):  # client side: a slot map being rebuilt is transient, a bad call not
        return isinstance(exc, rx.CrossSlotTransactionError) or "same key slot" in str(exc)
    return False


def result_for(exc: BaseException) -> SendResult:
    """The per-command outcome of a failed XADD in a pipeline."""
    return Rejected(describe(exc)) if is_permanent(exc) else RetryLater(describe(exc))


def reply_result(message: str) -> SendResult:
    """The outcome of an error reply given as text (from inside a script)."""
    return result_for(rx.ResponseError(message))


@contextmanager
def map_redis_errors(what: str, destination: str) -> Iterator[None]:
    """Re-raise redis-py/network errors as RetryableError or PermanentError."""
    try:
        yield
    except TransportError:
        raise
    except (rx.RedisError, RedisClusterException, OSError, TimeoutError) as exc:
        msg = f"redis {what} failed: {describe(exc)}"
        if is_permanent(exc):
            raise PermanentError(msg, destination=destination) from exc
        raise RetryableError(msg, destination=destination) from exc
