"""The one place where aio-pika/aiormq exceptions become outrelay's: the table :data:`ERRORS`.

:data:`ERRORS` (a :class:`~outrelay.kit.ErrorMap`, the transport's ``errors``)
says, per vendor exception, retryable or permanent and in which words; its
``{to}`` and ``{reply}`` are filled with the message's target and the
broker's reply text. :func:`classify` gives ``(retryable, message)`` with
the texts scrubbed of the configured passwords (a message never contains a
secret); :func:`result_for` makes a per-message result, :func:`mapped` is
the context manager for whole operations (connect, declare, check, reader);
:func:`publish_refused` words the 403 of ``check()``'s publish probe.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import aiormq.exceptions as ax

from outrelay.kit import (
    ErrorMap,
    PermanentError,
    Rejected,
    RetryableError,
    RetryLater,
    Rule,
    SendResult,
    certificate_refused,
    redact,
    tls_hint,
)

__all__ = [
    "ERRORS",
    "TOPIC_REFUSAL",
    "VENDOR_ERRORS",
    "classify",
    "mapped",
    "publish_refused",
    "reply_text",
    "result_for",
    "scrub",
]

VENDOR_ERRORS = (ax.AMQPError, ax.ChannelInvalidStateError, OSError, TimeoutError)
#: in the broker's 403 text when topic authorisation (not the exchange's write permission) refused a routing key
TOPIC_REFUSAL = "access to topic"


def scrub(text: str, secrets: Sequence[str]) -> str:
    for s in secrets:
        text = text.replace(s, "***")
    return text


def reply_text(exc: BaseException) -> str:
    """The broker's reply code and text an aiormq exception carries (else its type's name)."""
    # ChannelClosed and friends carry (reply_code, reply_text) from the broker
    args = [a for a in exc.args if isinstance(a, str | int)]
    return " ".join(str(a) for a in args) or type(exc).__name__


def _open_refused(exc: BaseException) -> bool:
    # aiormq's only trace of a 530 NOT_ALLOWED (or 403) answer to Connection.Open
    return isinstance(exc, ax.InvalidFrameError) and "Connection.Close" in str(exc)


def _tls(exc: BaseException) -> bool:
    return certificate_refused(exc) is not None


_UNREACHABLE = (ConnectionError, OSError, ax.AMQPConnectionError)


class _AmqpErrors(ErrorMap):
    """An :class:`~outrelay.kit.ErrorMap` whose hints are templates (see the module docstring)."""

    __slots__ = ()

    def words(self, exc: BaseException, target: str | None = None) -> str:
        """The hint of ``exc``'s rule filled in (unscrubbed: callers scrub or redact)."""
        refused = certificate_refused(exc)
        if refused is not None:
            return tls_hint(refused, "tls_ca_file")
        rule = self.rule(exc)
        hint = rule.hint if rule is not None else "unexpected {type}{to}"
        return hint.format(to=f" to {target!r}" if target else "", reply=reply_text(exc), type=type(exc).__name__)

    def message(self, exc: BaseException, what: str = "") -> str:
        return redact(": ".join(p for p in (what, self.words(exc)) if p))


#: every vendor exception: retryable or permanent, and how to say it (the first matching rule wins)
ERRORS = _AmqpErrors(
    Rule(_tls, "reject"),  # worded by tls_hint
    Rule((ax.AuthenticationError, ax.ProbableAuthenticationError), "reject",
         "authentication failed: check user/password and the user's access to the vhost"),
    Rule(ax.ConnectionNotAllowed, "reject", "the broker refused the vhost: check vhost and the user's permissions"),
    Rule(_open_refused, "reject", "the broker closed the connection while opening it: check that the vhost "
         "exists and the user may use it"),
    Rule(ax.ChannelNotFoundEntity, "retry",
         "not found{to}: {reply} (declare the exchange or set declare_exchange)"),
    Rule(ax.ChannelAccessRefused, "reject", "access refused{to}: {reply} (grant the user write permission)"),
    Rule(ax.ChannelPreconditionFailed, "reject", "precondition failed{to}: {reply}"),
    Rule(ax.PublishError, "retry", "returned by the broker{to}"),  # unroutable: the transport words it
    Rule(ax.DeliveryError, "retry",
         "the broker nacked the message{to} (queue overflow reject-publish or an internal error)"),
    Rule(TimeoutError, "retry", "no publisher confirm in time{to} (broker slow, blocked by an alarm, or unreachable)"),
    Rule((ax.ChannelInvalidStateError, ax.AMQPChannelError), "retry", "the channel closed{to}: {reply}"),
    Rule(_UNREACHABLE, "retry", "cannot reach the broker ({type}){to}"),
)  # fmt: skip


def classify(exc: BaseException, secrets: Sequence[str] = (), target: str | None = None) -> tuple[bool, str]:
    """``(retryable, message)`` for an aio-pika/aiormq exception (or a timeout), by :data:`ERRORS`."""
    return ERRORS.kind(exc) == "retry", scrub(ERRORS.words(exc, target), secrets)


def publish_refused(
    exc: ax.ChannelAccessRefused,
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
    reply = scrub(reply_text(exc), secrets)
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
