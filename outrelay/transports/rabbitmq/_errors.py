"""The one place where aio-pika/aiormq exceptions become outrelay's.

:func:`classify` decides retryable vs permanent and writes a message that
never contains a secret (texts are scrubbed of the configured passwords);
:func:`result_for` makes a per-message result, :func:`mapped` is the
context manager for whole operations (connect, declare, check, reader);
:func:`publish_refused` words the 403 of ``check()``'s publish probe.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import aiormq.exceptions

from outrelay.kit import PermanentError, Rejected, RetryableError, RetryLater, SendResult, certificate_refused, tls_hint

__all__ = [
    "TOPIC_REFUSAL",
    "VENDOR_ERRORS",
    "Unroutable",
    "classify",
    "mapped",
    "publish_refused",
    "result_for",
    "scrub",
]

VENDOR_ERRORS = (aiormq.exceptions.AMQPError, aiormq.exceptions.ChannelInvalidStateError, OSError, TimeoutError)
#: in the broker's 403 text when topic authorisation (not the exchange's write permission) refused a routing key
TOPIC_REFUSAL = "access to topic"


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


def publish_refused(
    exc: aiormq.exceptions.ChannelAccessRefused,
    *,
    user: str,
    vhost: str,
    exchange: str,
    routing_key: str,
    where: str,
    secrets: Sequence[str] = (),
) -> str:
    """One line for a 403 ACCESS_REFUSED answer to a ``basic.publish``: what the broker refused (write
    permission on the exchange, a topic permission, or an internal exchange), for whom, and the fix.

    ``exchange`` ``""`` is the default exchange, which RabbitMQ's permissions call ``amq.default``.
    Never contains a secret: ``where`` is the masked URL, the broker's text is scrubbed.
    """
    name = exchange or "amq.default"
    reply = scrub(_reply(exc), secrets)
    q_user, q_vhost = shlex.quote(user), shlex.quote(vhost)
    if "internal exchange" in reply:
        return (
            f"exchange {name!r} on {where} is internal: no client may publish to it (403 ACCESS_REFUSED); "
            "set exchange to one that is not internal"
        )
    if TOPIC_REFUSAL in reply:  # topic authorisation: write access for this routing key on a topic exchange
        return (
            f"user {user!r} lacks write permission on vhost {vhost!r} for routing key {routing_key!r} of topic "
            f"exchange {name!r} (403 ACCESS_REFUSED from {where}): grant it with `rabbitmqctl "
            f"set_topic_permissions -p {q_vhost} {q_user} {shlex.quote(name)} <write pattern> <read pattern>`"
        )
    write = shlex.quote("^" + name.replace(".", r"\.") + "$")  # exchange names are [A-Za-z0-9_.:-]
    return (
        f"user {user!r} lacks write permission on vhost {vhost!r} for exchange {name!r} (403 ACCESS_REFUSED from "
        f"{where}): grant it with `rabbitmqctl set_permissions -p {q_vhost} {q_user} <configure> {write} <read>` "
        "(the command replaces all three patterns: keep the configure and read ones the user has)"
    )


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
