"""Standard Webhooks signatures (https://www.standardwebhooks.com), both sides.

The sender adds three headers::

    webhook-id:        the event id (receivers dedupe on it)
    webhook-timestamp: Unix seconds when this attempt was signed
    webhook-signature: v1,<base64 HMAC-SHA256(key, f"{id}.{timestamp}.".encode() + body)>

A secret is either ``whsec_<base64 key>`` (the spec's form) or any other
string, whose UTF-8 bytes are the key. Several secrets (key rotation) give
several space-separated signatures; a receiver accepts a request when any
signature matches any of its secrets. Comparison is constant-time. Secrets
never appear in errors.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Iterable, Mapping

__all__ = [
    "SignatureError",
    "decode_secret",
    "normalize_secrets",
    "sign",
    "signature_headers",
    "verify",
    "verify_or_raise",
]

Secrets = str | bytes | Iterable[str | bytes] | None


class SignatureError(ValueError):
    """A request failed verification; the message says why (never the secret)."""


def decode_secret(secret: str | bytes) -> bytes:
    """The HMAC key of ``secret``: base64-decoded after ``whsec_``, else its bytes.

    :raises ValueError: a ``whsec_`` secret whose rest is not valid base64.
    """
    if isinstance(secret, bytes):
        return secret
    if secret.startswith("whsec_"):
        try:
            return base64.b64decode(secret[len("whsec_") :], validate=True)
        except binascii.Error:
            raise ValueError("a whsec_ secret must be followed by valid base64") from None
    return secret.encode("utf-8")


def normalize_secrets(secrets: Secrets) -> list[bytes]:
    """Keys from ``None``, one secret, or several (empty strings ignored)."""
    if secrets is None:
        return []
    if isinstance(secrets, str | bytes):
        secrets = [secrets]
    return [decode_secret(s) for s in secrets if s]


def sign(key: bytes, msg_id: str, timestamp: int, body: bytes) -> str:
    """One ``v1,<base64>`` signature of ``body`` for ``msg_id`` at ``timestamp``."""
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def signature_headers(keys: Iterable[bytes], msg_id: str, body: bytes, timestamp: int | None = None) -> dict[str, str]:
    """The three Standard Webhooks headers (no ``webhook-signature`` without keys)."""
    ts = int(time.time()) if timestamp is None else timestamp
    headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts)}
    sigs = [sign(k, msg_id, ts, body) for k in keys]
    if sigs:
        headers["webhook-signature"] = " ".join(sigs)
    return headers


def _header(headers: Mapping[str, str], name: str) -> str:
    for k, v in headers.items():
        if k.lower() == name:
            return v
    raise SignatureError(f"missing {name} header")


def verify_or_raise(
    secrets: Secrets, headers: Mapping[str, str], body: bytes, tolerance: float = 300, *, now: float | None = None
) -> None:
    """Check a request's Standard Webhooks signature.

    :raises SignatureError: no secrets configured, a header missing, the
        timestamp further than ``tolerance`` seconds from ``now``, or no
        signature matching any secret.
    """
    keys = normalize_secrets(secrets)
    if not keys:
        raise SignatureError("no secret configured to verify with")
    msg_id = _header(headers, "webhook-id")
    raw_ts = _header(headers, "webhook-timestamp")
    offered = _header(headers, "webhook-signature").split()
    try:
        ts = int(raw_ts)
    except ValueError:
        raise SignatureError(f"webhook-timestamp {raw_ts[:20]!r} is not Unix seconds") from None
    current = time.time() if now is None else now
    if abs(current - ts) > tolerance:
        raise SignatureError(f"webhook-timestamp is {current - ts:+.0f}s away from now (tolerance {tolerance:g}s)")
    candidates = [s.partition(",")[2].encode() for s in offered if s.startswith("v1,")]
    for key in keys:
        expected = sign(key, msg_id, ts, body).partition(",")[2].encode()
        # compare against every candidate, so timing does not reveal which matched
        if any([hmac.compare_digest(expected, c) for c in candidates]):
            return
    raise SignatureError("no webhook-signature matches a configured secret")


def verify(
    secrets: Secrets, headers: Mapping[str, str], body: bytes, tolerance: float = 300, *, now: float | None = None
) -> bool:
    """``True`` when :func:`verify_or_raise` accepts the request."""
    try:
        verify_or_raise(secrets, headers, body, tolerance=tolerance, now=now)
    except (SignatureError, ValueError):
        return False
    return True
