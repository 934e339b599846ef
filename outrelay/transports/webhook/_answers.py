"""What an HTTP answer means: the one place webhook results and check verdicts are built from answers.

:func:`classify` turns the answer to a POST into the message's
:class:`~outrelay.kit.SendResult` (the table in :mod:`._transport`'s
docstring); :func:`check_ping_answer` reads the answer to ``check()``'s
signed ping. Exceptions of the HTTP client are not answers: they go through
:data:`~._errors.ERRORS`. URLs are quoted through :func:`~._http.safe_url`
(no user info, query or fragment); no message quotes a secret or a header.
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from datetime import UTC

from outrelay.kit import Delivered, PermanentError, Rejected, RetryableError, RetryLater, SendResult
from outrelay.transports.webhook._http import Response, safe_url
from outrelay.transports.webhook._ping import PING_TYPE

__all__ = ["check_ping_answer", "classify", "excerpt", "parse_retry_after"]


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Seconds from a ``Retry-After`` value (delta-seconds or HTTP-date); None if absent/invalid."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    current = time.time() if now is None else now
    return max(0.0, when.timestamp() - current)


_DELIVERED = Delivered()


def classify(status: int, headers: Mapping[str, str], url: str, body: bytes = b"") -> SendResult:
    """The outcome of the answer ``status``/``headers``/``body`` to a POST to ``url`` (see the table in
    :mod:`._transport`); a failure quotes the start of ``body`` (:func:`excerpt`)."""
    if 200 <= status < 300:
        return _DELIVERED
    detail = excerpt(body)
    where = f"{safe_url(url)} answered {status}" + (f": {detail}" if detail else "")
    if 300 <= status < 400:
        location = headers.get("location")
        to = f" to {safe_url(location)}" if location else ""
        return Rejected(f"{where}; redirect{to} not followed, configure the final URL")
    if status in (408, 429) or status >= 500:
        return RetryLater(where, parse_retry_after(headers.get("retry-after")))
    if status == 410:
        return Rejected(f"{where} (Gone): the endpoint was removed", disable_destination=True)
    return Rejected(where)


def excerpt(body: bytes, limit: int = 200) -> str:
    """The start of an answer's body on one line (what the receiver said, to quote in a result)."""
    return " ".join(body[:limit].decode("utf-8", "replace").split())


def check_ping_answer(response: Response, url: str, *, signed: bool, destination: str) -> None:
    """Return for a 2xx answer to the ``check()`` ping; otherwise raise one line naming the status.

    ==================  =============================================================================
    2xx                 returns: the receiver verified and accepted the ping
    401, 403            PermanentError: signature or credentials rejected — check the secret
    3xx                 PermanentError: redirects are not followed, configure the final URL
    404, 405, 410       PermanentError: no webhook takes POST there — check the url
    other 4xx           PermanentError: the receiver refused the ping itself (e.g. an unknown type),
                        not its signature — accept :data:`PING_TYPE` or set ``check_ping = false``
    408, 429, 5xx       RetryableError (with ``Retry-After``): reachable, but failing for now
    ==================  =============================================================================

    The line quotes the start of the receiver's answer, never a secret or a header value.
    """
    status = response.status
    if 200 <= status < 300:
        return
    said = excerpt(response.body, 120)
    kind = "a signed" if signed else "an unsigned"
    where = f"{safe_url(url)} answered {status} to {kind} check ping" + (f" ({said})" if said else "")
    if status in (408, 429) or status >= 500:
        raise RetryableError(
            f"{where}; the receiver is reachable but failing: check its health, or run check again later",
            retry_after=parse_retry_after(response.headers.get("retry-after")),
            destination=destination,
        )
    if status in (401, 403):
        fix = (
            "the receiver rejected the signature or credentials: check that the destination's secret matches the "
            "receiver's (and any Authorization header or user info in the url)"
            if signed
            else "the receiver wants credentials: set the destination's secret (Standard Webhooks), or an "
            "Authorization header"
        )
        raise PermanentError(f"{where}: {fix}", destination=destination)
    if 300 <= status < 400:
        location = response.headers.get("location")
        to = f" to {safe_url(location)}" if location else ""
        raise PermanentError(f"{where}; redirect{to} not followed, configure the final URL", destination=destination)
    if status in (404, 405, 410):
        raise PermanentError(
            f"{where}: no webhook endpoint takes POST at this URL; check the destination's url",
            destination=destination,
        )
    raise PermanentError(
        f"{where}: the receiver refused the ping itself, not its signature (that would be 401/403); make it answer "
        f"2xx to events of type {PING_TYPE}, or set check_ping = false to probe with HEAD only",
        destination=destination,
    )
