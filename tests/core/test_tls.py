"""Recognising a refused TLS certificate behind client libraries' own exceptions."""

from __future__ import annotations

import ssl

from outrelay.kit import certificate_refused, tls_hint

TEXT = "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed certificate (_ssl.c:1006)"


def test_recognised_directly_by_text_and_by_cause() -> None:
    """The ssl error itself, a wrapper carrying its text (aiormq, redis-py) and a wrapper raised from
    it all give the reason; unrelated errors give None."""
    direct = ssl.SSLCertVerificationError(1, TEXT)
    direct.verify_message = "self-signed certificate"
    assert certificate_refused(direct) == "self-signed certificate"
    assert certificate_refused(ConnectionError(1, TEXT)) == "self-signed certificate"
    try:
        try:
            raise direct
        except ssl.SSLError as inner:
            raise RuntimeError("Unable to bootstrap") from inner
    except RuntimeError as outer:
        assert certificate_refused(outer) == "self-signed certificate"
    assert certificate_refused(ConnectionRefusedError(111, "Connection refused")) is None
    assert certificate_refused(None) is None


def test_hint_names_the_option() -> None:
    """The message says what was refused and which option fixes it."""
    line = tls_hint("self-signed certificate", "tls_ca_file")
    assert "refused (self-signed certificate)" in line and "set tls_ca_file" in line and "\n" not in line
