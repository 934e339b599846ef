"""The one boundary where HTTP outcomes and network errors become outrelay results.

:func:`post_once` sends one request under one deadline and never raises
for a network or protocol failure: every exception of the HTTP client
(:mod:`._http`) is mapped here (and only here) to :class:`~outrelay.RetryLater`
or :class:`~outrelay.Rejected`; an answer is mapped by :func:`classify`.
For ``check()``, :func:`probe` maps the same exceptions to
:class:`~outrelay.RetryableError` / :class:`~outrelay.PermanentError`, and
:func:`check_ping_answer` reads the answer to the signed ping.
URLs in messages go through :func:`safe_url`, which drops user info, query
and fragment (they may carry tokens); no message quotes a secret or a header.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import time
from collections.abc import Mapping
from datetime import UTC
from typing import Any
from urllib.parse import urlsplit

from outrelay.kit import Delivered, PermanentError, Rejected, RetryableError, RetryLater, SendResult
from outrelay.transports.webhook._http import ConnectionPool, InvalidRequest, ProtocolError, Response, parse_target
from outrelay.transports.webhook._ping import PING_TYPE
from outrelay.transports.webhook._ssrf import PrivateAddressRefused

__all__ = [
    "check_ping_answer",
    "classify",
    "describe",
    "exchange",
    "parse_retry_after",
    "post_once",
    "probe",
    "safe_url",
    "timeout_message",
]


def safe_url(url: str) -> str:
    """``url`` without user info, query or fragment (they may carry tokens)."""
    parts = urlsplit(str(url))
    if not parts.scheme:  # a relative reference (e.g. a Location header)
        return parts.path
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


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


def classify(status: int, headers: Mapping[str, str], url: str, detail: str = "") -> SendResult:
    """The outcome of an HTTP answer (see the module docstring's table)."""
    where = f"{safe_url(url)} answered {status}" + (f": {detail}" if detail else "")
    if 200 <= status < 300:
        return Delivered()
    if 300 <= status < 400:
        location = headers.get("location")
        to = f" to {safe_url(location)}" if location else ""
        return Rejected(f"{where}; redirect{to} not followed, configure the final URL")
    if status in (408, 429) or status >= 500:
        return RetryLater(where, parse_retry_after(headers.get("retry-after")))
    if status == 410:
        return Rejected(f"{where} (Gone): the endpoint was removed", disable_destination=True)
    return Rejected(where)


_BODY_LIMIT = 64 * 1024


def _detail(response: Response, limit: int = 200) -> str:
    """The start of the answer's body on one line (what the receiver said, to quote in an error)."""
    return " ".join(response.body[:limit].decode("utf-8", "replace").split())


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def timeout_message(url: str, limit: float) -> str:
    return (
        f"{safe_url(url)} did not answer within {limit:g}s (one deadline for connect, send and the whole "
        "answer); raise the destination's timeout if the receiver is that slow"
    )


async def exchange(
    pool: ConnectionPool, method: str, url: str, headers: dict[str, str], body: bytes, limit: float
) -> Response:
    """One request and its whole answer, bounded by ``limit`` seconds in all.

    :raises TimeoutError: the deadline passed (the connection is dropped).
    :raises PrivateAddressRefused, InvalidRequest, ProtocolError, OSError: see :mod:`._http`.
    """
    target = parse_target(url)
    async with asyncio.timeout(limit) as deadline:
        try:
            return await pool.request(method, target, headers, body, body_limit=_BODY_LIMIT)
        except TimeoutError:
            if deadline.expired():
                raise
            # an OS-level ETIMEDOUT is a network failure, not our deadline
            raise ConnectionError("the connection timed out") from None


async def post_once(pool: ConnectionPool, url: str, headers: dict[str, str], body: bytes, limit: float) -> SendResult:
    """POST once under one deadline and classify; the one place client exceptions are mapped.

    At most :data:`_BODY_LIMIT` bytes of the answer are read: enough to keep
    the connection reusable for ordinary answers and to quote an error,
    without letting an endpoint make the relay download a large body.
    """
    try:
        response = await exchange(pool, "POST", url, headers, body, limit)
    except PrivateAddressRefused as exc:
        return Rejected(str(exc))
    except TimeoutError:
        return RetryLater(timeout_message(url, limit))
    except InvalidRequest as exc:
        return Rejected(f"cannot send to {safe_url(url)}: {exc}")
    except ProtocolError as exc:
        return RetryLater(f"{safe_url(url)} sent an invalid HTTP answer: {exc}")
    except OSError as exc:  # connect, reset, TLS
        return RetryLater(f"cannot deliver to {safe_url(url)}: {describe(exc)}")
    status = response.status
    answer = {"status": status, "body": response.body[:_EXCERPT].decode("utf-8", "replace")}  # the attempt log's
    if 200 <= status < 300:
        return Delivered(detail=answer)
    result: Any = classify(status, response.headers, url, _detail(response))  # RetryLater or Rejected
    failed: SendResult = dataclasses.replace(result, detail=answer)
    return failed


#: bytes of an answer's body kept as the attempt's detail (the attempt log cuts it again to its own limit)
_EXCERPT = 512


async def probe(
    pool: ConnectionPool, method: str, url: str, headers: dict[str, str], body: bytes, limit: float, *, destination: str
) -> Response:
    """One ``check()`` request under one deadline; every client failure raised as one outrelay error line.

    :raises PermanentError: the SSRF guard refused the address (the line names ``allow_private_network``),
        or the URL or a header cannot go on the wire.
    :raises RetryableError: cannot connect (refused, reset, TLS), an invalid or cut-short answer,
        or no whole answer within ``limit`` seconds.
    """
    try:
        return await exchange(pool, method, url, headers, body, limit)
    except PrivateAddressRefused as exc:
        raise PermanentError(str(exc), destination=destination) from None
    except InvalidRequest as exc:
        raise PermanentError(
            f"cannot send to {safe_url(url)}: {exc}; fix the destination's url or headers", destination=destination
        ) from None
    except TimeoutError:
        raise RetryableError(timeout_message(url, limit), destination=destination) from None
    except (OSError, ProtocolError) as exc:
        raise RetryableError(
            f"cannot reach {safe_url(url)}: {describe(exc)}; check the URL and that the receiver is up",
            destination=destination,
        ) from None


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
    said = _detail(response, 120)
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
