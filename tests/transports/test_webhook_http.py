"""The webhook transport's HTTP client: one deadline per attempt, framing, pooling, TLS (raw servers on loopback)."""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import ssl
import time
from pathlib import Path

import pytest

from outrelay import Delivered, Rejected, RetryableError, RetryLater
from outrelay.transports.webhook._http import InvalidRequest, encode_head, parse_target
from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest
from tests.transports.webhook_support import SECRET, Answer, RawServer, answer_bytes, event, make_transport, messages

NO_CONTENT = b"HTTP/1.1 204 No Content\r\n\r\n"


async def send(url: str, count: int = 1, **options: object) -> list[object]:
    """Send ``count`` events of one stream, one request after another, through one transport."""
    t = make_transport(url, **options)
    await t.open()
    try:
        return [(await t.send(messages(t, [event(n=i)])))[0] for i in range(count)]
    finally:
        await t.close()


def drip(prefix: bytes, rest: bytes) -> Answer:
    """An answer writing ``prefix`` at once, then ``rest`` one byte per second."""

    async def answer(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(prefix)
        for i in range(len(rest)):
            await writer.drain()
            await asyncio.sleep(1)
            writer.write(rest[i : i + 1])

    return answer


class TestDeadline:
    @pytest.mark.parametrize(
        ("prefix", "rest"),
        [
            (b"HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n", b"x" * 50),
            (b"", b"HTTP/1.1 204 No Content\r\nx-slow: " + b"y" * 50 + b"\r\n\r\n"),
        ],
        ids=["body-drip", "head-drip"],
    )
    async def test_a_dripping_answer_fails_within_the_deadline(self, prefix: bytes, rest: bytes) -> None:
        """An answer sent one byte per second is RetryLater once the attempt's one deadline passes."""
        async with RawServer(drip(prefix, rest)) as server:
            started = time.monotonic()
            [result] = await send(server.url, timeout=1.0)
            elapsed = time.monotonic() - started
        assert isinstance(result, RetryLater) and "did not answer within 1s" in result.error
        assert "whole answer" in result.error and "/hook" in result.error
        assert 0.9 <= elapsed < 3  # without the deadline: 50 s

    async def test_the_timed_out_connection_is_not_reused(self) -> None:
        """After a deadline expires its connection is dropped; the next attempt opens a new one."""
        answers = [drip(b"HTTP/1.1 200 OK\r\ncontent-length: 9\r\n\r\n", b"123456789"), answer_bytes(NO_CONTENT)]

        async def answer(writer: asyncio.StreamWriter, request: bytes) -> None:
            await answers.pop(0)(writer, request)

        async with RawServer(answer) as server:
            first, second = await send(server.url, 2, timeout=0.5)
        assert isinstance(first, RetryLater) and second == Delivered() and server.connections == 2

    async def test_check_has_the_same_deadline(self) -> None:
        """check() against a dripping endpoint raises RetryableError within the deadline."""
        async with RawServer(drip(b"", b"HTTP/1.1 200 OK\r\n\r\n")) as server:
            started = time.monotonic()
            with pytest.raises(RetryableError, match=r"did not answer within 0\.5s"):
                await make_transport(server.url, timeout=0.5).check()
        assert time.monotonic() - started < 3

    async def test_a_cancelled_send_drops_its_connection(self) -> None:
        """Cancelling send mid-request drops that connection; the transport keeps working."""
        answers = [drip(b"", NO_CONTENT), answer_bytes(NO_CONTENT)]

        async def answer(writer: asyncio.StreamWriter, request: bytes) -> None:
            await answers.pop(0)(writer, request)

        async with RawServer(answer) as server:
            t = make_transport(server.url)
            await t.open()
            try:
                with pytest.raises(TimeoutError):
                    await asyncio.wait_for(t.send(messages(t, [event()])), 0.3)
                assert await t.send(messages(t, [event()])) == [Delivered()]
            finally:
                await t.close()
        assert server.connections == 2


class TestFraming:
    @pytest.mark.parametrize("pace", ["at-once", "byte-by-byte"])
    async def test_chunked_error_body_is_quoted_and_the_connection_reused(self, pace: str) -> None:
        """A chunked answer (extensions, trailers), whole or byte by byte, is quoted and keeps the connection."""
        chunked = (
            b"HTTP/1.1 400 Bad Request\r\ntransfer-encoding: chunked\r\n\r\n"
            b"4;x=y\r\nbad \r\n9\r\nsignature\r\n0\r\nt: 1\r\n\r\n"
        )

        async def bytewise(writer: asyncio.StreamWriter, request: bytes) -> None:
            for i in range(len(chunked)):
                writer.write(chunked[i : i + 1])
                await writer.drain()
                await asyncio.sleep(0.001)

        async with RawServer(answer_bytes(chunked) if pace == "at-once" else bytewise) as server:
            results = await send(server.url, 2)
        assert all(isinstance(r, Rejected) and "answered 400: bad signature" in r.reason for r in results)
        assert server.connections == 1

    async def test_close_delimited_body_then_a_new_connection(self) -> None:
        """A body without length runs to connection close; the next request connects again."""
        async with RawServer(answer_bytes(b"HTTP/1.1 200 OK\r\n\r\nhello", close=True)) as server:
            assert await send(server.url, 2) == [Delivered(), Delivered()]
        assert server.connections == 2

    async def test_interim_100_answer_is_skipped(self) -> None:
        """A 1xx interim answer is skipped and the final answer decides."""
        async with RawServer(answer_bytes(b"HTTP/1.1 100 Continue\r\n\r\n" + NO_CONTENT)) as server:
            assert await send(server.url, 2) == [Delivered(), Delivered()]
        assert server.connections == 1

    async def test_garbage_answer_is_retryable(self) -> None:
        """An answer that is not HTTP/1.x is a retryable failure saying so."""
        async with RawServer(answer_bytes(b"SSH-2.0-OpenSSH\r\n\r\n")) as server:
            [result] = await send(server.url)
        assert isinstance(result, RetryLater) and "invalid HTTP answer" in result.error

    @pytest.mark.parametrize("framing", ["length", "chunked"])
    async def test_large_body_is_not_downloaded(self, framing: str) -> None:
        """A 2xx whose body passes the 64 KiB limit is Delivered at the limit, without waiting for the rest."""
        head = b"content-length: 1000000" if framing == "length" else b"transfer-encoding: chunked"
        part = b"z" * 70_000 if framing == "length" else b"%x\r\n" % 70_000 + b"z" * 70_000 + b"\r\n"

        async def answer(writer: asyncio.StreamWriter, request: bytes) -> None:
            writer.write(b"HTTP/1.1 200 OK\r\n" + head + b"\r\n\r\n" + part)
            await writer.drain()
            await asyncio.sleep(30)  # the rest never comes: only the deadline would end a full read

        async with RawServer(answer) as server:
            started = time.monotonic()
            assert await send(server.url, 2, timeout=5) == [Delivered(), Delivered()]
            assert time.monotonic() - started < 4  # reading on would hit the 5 s deadline twice
        assert server.connections == 2

    async def test_closed_before_answering(self) -> None:
        """A new connection closed without an answer is RetryLater naming the early close."""
        async with RawServer(answer_bytes(b"", close=True)) as server:
            [result] = await send(server.url)
        assert isinstance(result, RetryLater) and "closed before the answer was complete" in result.error

    async def test_stale_keep_alive_connection_is_resent_once(self) -> None:
        """A kept-alive connection the server drops unanswered is retried once on a new connection."""
        calls = 0

        async def answer(writer: asyncio.StreamWriter, request: bytes) -> None:
            nonlocal calls
            calls += 1
            if calls == 2:
                writer.close()  # the server gave up on this idle connection just as we reused it
            else:
                writer.write(NO_CONTENT)

        async with RawServer(answer) as server:
            assert await send(server.url, 2) == [Delivered(), Delivered()]
        assert server.connections == 2 and calls == 3


class TestRequest:
    def test_header_values_cannot_break_the_framing(self) -> None:
        """A CR, LF or NUL in any header value, or a non-Latin-1 character, is refused before sending."""
        target = parse_target("http://127.0.0.1:8/h")
        for value in ("a\r\nInjected: 1", "a\nb", "a\0b", "caf\u20ac"):
            with pytest.raises(InvalidRequest):
                encode_head("POST", target, {"x-v": value}, 0)

    def test_url_user_info_becomes_basic_auth(self) -> None:
        """User info in the URL is sent as Basic credentials, and the Host header omits a default port."""
        target = parse_target("https://us%40er:p%3Aw@example.com:443/a/b?q=1")
        head = encode_head("POST", target, {}, 3).decode()
        assert head.startswith("POST /a/b?q=1 HTTP/1.1\r\nhost: example.com\r\n")
        assert f"authorization: Basic {base64.b64encode(b'us@er:p:w').decode()}" in head

    async def test_concurrency_bounds_connections_and_they_are_reused(self) -> None:
        """No more than ``concurrency`` requests are in flight, over as many reused connections."""
        in_flight = peak = 0

        async def slow(req: WebhookRequest) -> int:
            nonlocal in_flight, peak
            in_flight += 1
            peak = max(peak, in_flight)
            await asyncio.sleep(0.01)
            in_flight -= 1
            return 204

        async with WebhookReceiver(secrets=SECRET, respond=slow) as rx:
            t = make_transport(rx.url, concurrency=4)
            await t.open()
            try:
                for lo in range(0, 60, 20):
                    evs = [event(stream=f"s{i % 10}", n=i) for i in range(lo, lo + 20)]
                    assert await t.send(messages(t, evs)) == [Delivered()] * 20
            finally:
                await t.close()
        assert peak == 4 and rx.connections == 4 and len(rx.events()) == 60


def _tls_server_context(tmp: Path) -> ssl.SSLContext:
    """A server context with a fresh self-signed certificate for 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "outrelay-test")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
        .sign(key, hashes.SHA256())
    )
    (tmp / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(tmp / "cert.pem", tmp / "key.pem")
    return ctx


class TestTLS:
    async def test_untrusted_certificate_is_refused_by_default(self, tmp_path: Path) -> None:
        """With verify_tls on, a self-signed certificate fails the attempt (retryable) naming the cause."""
        async with RawServer(answer_bytes(NO_CONTENT), tls=_tls_server_context(tmp_path)) as server:
            [result] = await send(server.url)
        assert isinstance(result, RetryLater) and "CERTIFICATE_VERIFY_FAILED" in result.error

    async def test_verify_tls_off_delivers_over_https_and_reuses(self, tmp_path: Path) -> None:
        """With verify_tls = false the request goes over TLS and the TLS connection is kept alive."""
        async with RawServer(answer_bytes(NO_CONTENT), tls=_tls_server_context(tmp_path)) as server:
            assert server.url.startswith("https://")
            assert await send(server.url, 2, verify_tls=False) == [Delivered(), Delivered()]
        assert server.connections == 1 and len(server.requests) == 2
