"""Network peers for fault and TLS tests: a loopback TCP proxy that can cut connections, optionally
terminating TLS in front of a plaintext broker (so a transport's TLS options are tested against the
real broker behind it), and a throwaway certificate for 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import ssl
import subprocess
from pathlib import Path

import pytest

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


class TcpProxy:
    """A loopback TCP proxy whose :meth:`cut` drops every open connection (a network fault).

    With ``tls=(cert, key)`` it accepts TLS connections with that certificate and forwards the
    plaintext upstream (TLS termination); ``listen_port`` picks the port (0: any free one).
    """

    def __init__(self, host: str, port: int, *, tls: tuple[Path, Path] | None = None, listen_port: int = 0) -> None:
        self.upstream = (host, port)
        self.port = listen_port
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(str(tls[0]), str(tls[1]))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.upstream)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            dst.close()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def cut(self) -> None:
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
