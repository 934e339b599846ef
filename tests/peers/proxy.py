"""Network peers for fault and TLS tests: a loopback TCP proxy that injects faults (cut, reset,
black hole, latency), optionally terminating TLS in front of a plaintext broker (so a transport's
TLS options are tested against the real broker behind it), and a throwaway certificate for 127.0.0.1."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from outrelay.conformance._proxy import TcpProxy  # the fault proxy lives in the package (conformance kit)

__all__ = ["TcpProxy", "make_cert", "tls_cert"]


def make_cert(directory: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert, key), made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
         "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def tls_cert(tmp_path: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (cert, key)."""
    return make_cert(tmp_path)
