"""Masking the password in a broker URL while keeping who connects readable."""

from __future__ import annotations

import re

__all__ = ["mask_url"]

_URL_CREDS = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<userinfo>[^@/\s]+)@", re.IGNORECASE)


def mask_url(url: str, *, bare_is_secret: bool = False) -> str:
    """``url`` with the password of its user info masked: ``amqp://user:secret@host`` ->
    ``amqp://user:***@host``. User info without a colon is a user name (kept), unless
    ``bare_is_secret`` says it is a token (NATS: ``nats://token@host`` -> ``nats://***@host``).
    Unlike :func:`~outrelay.kit.redact`, the user name stays, for messages that say who was refused.
    """

    def sub(m: re.Match[str]) -> str:
        user, sep, _ = m.group("userinfo").partition(":")
        if sep:
            return f"{m.group('scheme')}{user}:***@"
        return f"{m.group('scheme')}{'***' if bare_is_secret else user}@"

    return _URL_CREDS.sub(sub, url)
