"""TLS for transports: a client context, and a refused certificate recognised behind a client's error.

Clients wrap the ``ssl`` error in their own connection error (aiormq's
AMQPConnectionError, aiokafka's KafkaConnectionError, redis-py's
ConnectionError) whose name reads like "broker unreachable". Transports call
:func:`certificate_refused` first so the one-line error says what is wrong —
the certificate — and how to fix it.
"""

from __future__ import annotations

import re
import ssl

from outrelay.core.model.errors import PermanentError

__all__ = ["certificate_refused", "client_ssl_context", "tls_hint"]

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


def client_ssl_context(
    *,
    ca_file: str | None = None,
    cert_file: str | None = None,
    key_file: str | None = None,
    key_password: str | None = None,
    check_hostname: bool = True,
    options: str = "ca_file, cert_file, key_file",
) -> ssl.SSLContext:
    """A client TLS context verifying the server (against ``ca_file``, else the
    system's CAs), with a client certificate when ``cert_file`` is given.

    :raises PermanentError: a file cannot be read, the key does not open with
        ``key_password`` or does not belong to the certificate; the message
        names ``options`` (the transport's own option names) as what to fix.
    """
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
        ctx.check_hostname = check_hostname
        if cert_file:
            ctx.load_cert_chain(cert_file, key_file, password=key_password)
    except OSError as exc:  # ssl.SSLError is one ("PEM lib": a wrong password, a key of another certificate)
        raise PermanentError(
            f"TLS files could not be loaded ({type(exc).__name__}: {exc}): check {options}, that the key "
            "belongs to the certificate, and its password if the key is encrypted"
        ) from exc
    return ctx
