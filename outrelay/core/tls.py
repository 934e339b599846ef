"""Recognising a refused TLS certificate behind a client library's own exception.

Clients wrap the ``ssl`` error in their own connection error (aiormq's
AMQPConnectionError, aiokafka's KafkaConnectionError, redis-py's
ConnectionError) whose name reads like "broker unreachable". Transports call
:func:`certificate_refused` first so the one-line error says what is wrong —
the certificate — and how to fix it.
"""

from __future__ import annotations

import re
import ssl

__all__ = ["certificate_refused", "tls_hint"]

_REASON = re.compile(r"certificate verify failed:\s*([^()\]]*[^()\]\s])")


def certificate_refused(exc: BaseException | None) -> str | None:
    """The verification failure's reason when ``exc`` (or an exception it was raised from, or whose
    text it carries) is a refused server certificate; None otherwise."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ssl.SSLCertVerificationError):
            return exc.verify_message or "certificate verify failed"
        text = " ".join(str(a) for a in exc.args) or str(exc)
        if "CERTIFICATE_VERIFY_FAILED" in text or "certificate verify failed" in text:
            match = _REASON.search(text)
            return match.group(1).strip() if match else "certificate verify failed"
        exc = exc.__cause__ or exc.__context__
    return None


def tls_hint(reason: str, ca_option: str) -> str:
    """The message for a refused certificate, naming the option that fixes it."""
    return (
        f"TLS: the server's certificate was refused ({reason}); set {ca_option} to the CA that signed it, "
        "or connect by a host name the certificate names"
    )
