"""The one place where aio-pika/aiormq exceptions become outrelay's.

:func:`classify` decides retryable vs permanent and writes a message that
never contains a secret (texts are scrubbed of the configured passwords);
:func:`result_for` makes a per-message result, :func:`mapped` is the
context manager for whole operations (connect, declare, check, reader).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import aiormq.exceptions

from outrelay.core.errors import PermanentError, RetryableError
from outrelay.core.tls import certificate_refused, tls_hint
from outrelay.core.transport import Rejected, RetryLater, SendResult

__all__ = ["VENDOR_ERRORS", "Unroutable", "classify", "mapped", "result_for", "scrub"]

VENDOR_ERRORS = (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, OSError, TimeoutError)


class Unroutable(Exception):
    """The broker returned a mandatory message: no queue is bound for its routing key."""


def scrub(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


def _reply(exc: BaseException) -> str:
    # ChannelClosed and friends carry (reply_code, reply_text) from the broker
    args = [a for a in exc.args if isinstance(a, str | int)]
    return " ".join(str(a) for a in args) or type(exc).__name__


def classify(exc: BaseException, secrets: Sequence[str] = (), target: str | None = None) -> tuple[bool, str]:
    """``(retryable, message)`` for an aio-pika/aiormq exception (or a timeout)."""
    to = f" to {target!r}" if target else ""
    if isinstance(exc, aiormq.exceptions.AuthenticationError | aiormq.exceptions.ProbableAuthenticationError):
        return False, "authentication failed: check user/password and the user's access to the vhost"
    if isinstance(exc, aiormq.exceptions.ConnectionNotAllowed):
        return False, "the broker refused the vhost: check vhost and the user's permissions"
    if isinstance(exc, aiormq.exceptions.InvalidFrameError) and "Connection.Close" in str(exc):
        # aiormq's only trace of a 530 NOT_ALLOWED (or 403) answer to Connection.Open
        return (
            False,
            "the broker closed the connection while opening it: check that the vhost exists and the user may use it",
        )
    if isinstance(exc, aiormq.exceptions.ChannelNotFoundEntity):
        return True, f"not found{to}: {scrub(_reply(exc), secrets)} (declare the exchange or set declare_exchange)"
    if isinstance(exc, aiormq.exceptions.ChannelAccessRefused):
        return False, f"access refused{to}: {scrub(_reply(exc), secrets)} (grant the user write permission)"
    if isinstance(exc, aiormq.exceptions.ChannelPreconditionFailed):
        return False, f"precondition failed{to}: {scrub(_reply(exc), secrets)}"
    if isinstance(exc, aiormq.exceptions.PublishError):
        return True, f"returned by the broker{to}"  # handled as Unroutable by the transport
    if isinstance(exc, aiormq.exceptions.DeliveryError):
        return True, f"the broker nacked the message{to} (queue overflow reject-publish or an internal error)"
    if isinstance(exc, TimeoutError):
        return True, f"no publisher confirm in time{to} (broker slow, blocked by an alarm, or unreachable)"
    if isinstance(exc, aiormq.exceptions.ChannelInvalidStateError | aiormq.exceptions.AMQPChannelError):
        return True, f"the channel closed{to}: {scrub(_reply(exc), secrets)}"
    if isinstance(exc, ConnectionError | OSError | aiormq.exceptions.AMQPConnectionError):
        refused = certificate_refused(exc)
        if refused is not None:
            return False, tls_hint(refused, "tls_ca_file")
        return True, f"cannot reach the broker ({type(exc).__name__}){to}"
    return True, f"unexpected {type(exc).__name__}{to}"


def result_for(exc: BaseException, secrets: Sequence[str], target: str) -> SendResult:
    retryable, message = classify(exc, secrets, target)
    return RetryLater(message) if retryable else Rejected(message)


@contextmanager
def mapped(what: str, destination: str, secrets: Sequence[str] = ()) -> Iterator[None]:
    """Raise outrelay errors for vendor failures of ``what``; the message names what and why."""
    try:
        yield
    except VENDOR_ERRORS as exc:
        retryable, message = classify(exc, secrets)
        cls = RetryableError if retryable else PermanentError
        raise cls(f"{what}: {message}", destination=destination) from exc
