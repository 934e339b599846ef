"""The one boundary where HTTP outcomes and httpx exceptions become outrelay results.

:func:`post_once` sends one request and never raises for a network or
protocol failure: every httpx exception is mapped here (and only here) to
:class:`~outrelay.RetryLater` or :class:`~outrelay.Rejected`; an answer is
mapped by :func:`classify`. URLs in messages go through :func:`safe_url`,
which drops user info, query and fragment (they may carry tokens).
"""

from __future__ import annotations

import email.utils
import time
from collections.abc import Mapping
from datetime import UTC
from urllib.parse import urlsplit

import httpx

from outrelay.core.transport import Delivered, Rejected, RetryLater, SendResult
from outrelay.transports.webhook._ssrf import PrivateAddressRefused

__all__ = ["classify", "describe", "parse_retry_after", "post_once", "safe_url"]


def safe_url(url: str | httpx.URL) -> str:
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


def describe(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


async def post_once(
    client: httpx.AsyncClient, url: str, headers: dict[str, str], body: bytes, limit: float
) -> SendResult:
    """POST once and classify; the one place httpx exceptions are mapped.

    At most :data:`_BODY_LIMIT` bytes of the answer are read: enough to keep
    the connection reusable for ordinary answers and to quote an error,
    without letting an endpoint make the relay download a large body.
    """
    try:
        async with client.stream("POST", url, content=body, headers=headers) as response:
            answer = b""
            async for chunk in response.aiter_bytes():
                answer += chunk
                if len(answer) > _BODY_LIMIT:
                    break  # closing early drops this connection, which is fine
    except PrivateAddressRefused as exc:
        return Rejected(str(exc))
    except httpx.TimeoutException:
        return RetryLater(f"{safe_url(url)} did not answer within {limit:g}s")
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        return Rejected(f"invalid webhook URL {safe_url(url)}: {describe(exc)}")
    except httpx.TransportError as exc:  # connect/read/write/protocol errors
        return RetryLater(f"cannot deliver to {safe_url(url)}: {describe(exc)}")
    detail = ""
    if response.status_code >= 300:
        detail = " ".join(answer[:200].decode("utf-8", "replace").split())
    return classify(response.status_code, response.headers, url, detail)
