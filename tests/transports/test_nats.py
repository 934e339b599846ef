"""The nats transport against a real JetStream server."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import nats
import nkeys
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg

from outrelay import (
    Delivered,
    Event,
    EventError,
    Message,
    PermanentError,
    Rejected,
    RetryableError,
    RetryLater,
    UsageError,
)
from outrelay.core.model import cloudevents
from outrelay.transports.nats._acks import header_block
from outrelay.transports.nats._config import NatsConfig, mask_url
from outrelay.transports.nats._transport import NatsTransport, drop_unsent
from tests.peers.nats import StreamFactory, private_nats_server
from tests.services import free_port


def _messages(t: NatsTransport, events: list[Event]) -> list[Message]:
    return [Message(e, t.target(e), e.stream) for e in events]


@pytest.fixture
async def stream(nats_streams: StreamFactory) -> tuple[str, str]:
    return await nats_streams("nt", duplicate_window=60)


class TestConfig:
    def test_secrets_never_print(self) -> None:
        """Token and password are masked in the config repr and a URL password in messages."""
        cfg = NatsConfig(user="relay", password="hunter2")
        assert "hunter2" not in repr(cfg)
        assert NatsConfig(token="s3cret").token is not None and "s3cret" not in repr(NatsConfig(token="s3cret"))
        assert mask_url("nats://relay:hunter2@h:4222") == "nats://relay:***@h:4222"
        assert "hunter2" not in repr(NatsConfig(servers=("nats://relay:hunter2@h:4222",)))
        assert mask_url("nats://tok@h:4222") == "nats://***@h:4222"

    def test_one_kind_of_credentials(self) -> None:
        """Giving a token and a user/password together is a config error."""
        with pytest.raises(ValueError, match="one kind of credentials"):
            NatsConfig(token="a", user="u", password="p")


class TestPublish:
    async def test_headers_and_payload(self, nats_url: str, stream: tuple[str, str]) -> None:
        """A message carries the bytes, ce-* headers, Content-Type and Nats-Msg-Id = event id."""
        name, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{type}", expected_stream=name))
        await t.open()
        try:
            ev = Event(type="order.created", stream="o-1", data={"n": 1}, tenant="acme", labels={"a": "b"})
            async with t.reader(f"{prefix}.>") as r:
                assert await t.send(_messages(t, [ev])) == [Delivered()]
                (got,) = await r.read(1, 5)
            assert got.target == f"{prefix}.order.created"
            assert got.body == ev.data and got.content_type == "application/json"
            assert got.headers["Nats-Msg-Id"] == ev.id
            assert got.headers["ce-id"] == ev.id and got.headers["ce-partitionkey"] == "o-1"
            assert got.event == cloudevents.from_binary(
                cloudevents.binary_headers(ev), ev.data, content_type=ev.content_type
            )
            assert got.key == "o-1"
        finally:
            await t.close()

    async def test_binding_headers_datacontenttype_and_percent_encoding(
        self, nats_url: str, stream: tuple[str, str]
    ) -> None:
        """Per the CloudEvents NATS binding the message carries ce-datacontenttype and percent-encoded
        non-ASCII values (header-safe ASCII on the wire); the reader and the SDK's decoding give them back."""
        from cloudevents.core.bindings.http import HTTPMessage, from_binary
        from cloudevents.core.formats.json import JSONFormat

        name, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{type}", expected_stream=name))
        await t.open()
        try:
            ev = Event(
                type="order.created",
                stream="Straße 7",
                data={"n": 1},
                tenant="café",
                subject='Euro € "😀" 100%',
                labels={"ort": "Zürich"},
                metadata={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "k": "ü"},
            )
            async with t.reader(f"{prefix}.>") as r:
                assert await t.send(_messages(t, [ev])) == [Delivered()]
                (got,) = await r.read(1, 5)
        finally:
            await t.close()
        assert got.headers["ce-datacontenttype"] == "application/json"
        assert got.headers["ce-subject"] == "Euro%20%E2%82%AC%20%22%F0%9F%98%80%22%20100%25"
        ce = {k: v for k, v in got.headers.items() if k.startswith("ce-")}
        assert all(v.isascii() and " " not in v and '"' not in v for v in ce.values())
        assert got.event == ev and got.key == "Straße 7"
        # the SDK has no NATS binding; its HTTP one applies the same ce-* percent-decoding
        sdk = from_binary(HTTPMessage(headers=ce, body=got.body), JSONFormat())
        assert sdk.get_subject() == 'Euro € "😀" 100%' and sdk.get_datacontenttype() == "application/json"
        assert sdk.get_attributes()["tenantid"] == "café" and sdk.get_attributes()["labels"] == '{"ort":"Zürich"}'
        assert sdk.get_data() == {"n": 1}

    async def test_resend_is_reported_duplicate(self, nats_url: str, stream: tuple[str, str]) -> None:
        """A re-sent event id inside the duplicate window is acked as a duplicate and stored once."""
        name, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".x", expected_stream=name))
        await t.open()
        assert t.capabilities.native_dedupe and t.capabilities.dedupe_window == 60
        try:
            ev = Event(type="t", stream="s")
            async with t.reader(f"{prefix}.x") as r:
                assert await t.send(_messages(t, [ev])) == [Delivered()]
                assert await t.send(_messages(t, [ev])) == [Delivered(duplicate=True)]
                assert len(await r.read(5, 1.0)) == 1
        finally:
            await t.close()

    @pytest.mark.parametrize("pipeline", [True, False])
    async def test_order_per_stream_in_one_batch(self, nats_url: str, stream: tuple[str, str], pipeline: bool) -> None:
        """A batch holding several messages per stream arrives in batch order per stream (pipelined or not)."""
        _, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{stream}", pipeline=pipeline))
        await t.open()
        try:
            events = [Event(type="t", stream=f"s{i % 7}", data={"i": i}) for i in range(700)]
            async with t.reader(f"{prefix}.>") as r:
                results = await t.send(_messages(t, events))
                assert all(isinstance(x, Delivered) for x in results)
                got = await r.read(700, 10)
            for s in range(7):
                want = [e.id for e in events if e.stream == f"s{s}"]
                assert [g.event.id for g in got if g.event.stream == f"s{s}"] == want
        finally:
            await t.close()

    async def test_reopens_a_closed_connection(self, nats_url: str, stream: tuple[str, str]) -> None:
        """When the client connection is closed under the transport, the next send reconnects by itself."""
        _, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".x"))
        await t.open()
        try:
            assert t._nc is not None
            await t._nc.close()  # what giving up on reconnecting looks like
            assert await t.send(_messages(t, [Event(type="t", stream="s")])) == [Delivered()]
        finally:
            await t.close()

    async def test_whitespace_subject_is_rejected_and_connection_survives(
        self, nats_url: str, stream: tuple[str, str]
    ) -> None:
        """A subject with a space or CR/LF (a target not from the template, which escapes them) is Rejected before
        it reaches the wire (it would split the HPUB line), its stream's later event held, other streams delivered."""
        name, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{stream}", expected_stream=name))
        assert t.target(Event(type="t", stream="order 42")) == f"{prefix}.order%2042"  # the template escapes it
        with pytest.raises(EventError):  # and an Event refuses CR/LF
            Event(type="t", stream="x\r\nPUB evil 1\r\n")
        await t.open()
        try:
            bad = Event(type="t", stream="order 42")
            inject = Event(type="t", stream="inject")
            later = Event(type="t", stream="order 42")
            good = Event(type="t", stream="fine")
            raw = {
                bad.id: f"{prefix}.order 42",
                inject.id: f"{prefix}.x\r\nPUB evil 1\r\n",
                later.id: f"{prefix}.order 42",
            }
            async with t.reader(f"{prefix}.>") as r:
                msgs = [Message(e, raw.get(e.id, t.target(e)), e.stream) for e in [bad, inject, later, good]]
                results = await t.send(msgs)
                assert isinstance(results[0], Rejected) and "whitespace" in results[0].reason
                assert isinstance(results[1], Rejected) and isinstance(results[2], RetryLater)
                assert results[3] == Delivered()
                (got,) = await r.read(1, 5)
                assert got.event.id == good.id
                assert await t.send(_messages(t, [Event(type="t", stream="fine")])) == [Delivered()]
        finally:
            await t.close()

    async def test_oversized_is_rejected(self, nats_url: str, stream: tuple[str, str]) -> None:
        """Data over max_message_bytes is Rejected; exactly at the limit is delivered."""
        _, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".big", max_message_bytes=2000))
        await t.open()
        try:
            ok, big = Event(type="t", stream="s", data=b"x" * 2000), Event(type="t", stream="s2", data=b"x" * 2001)
            ok_r, big_r = await t.send(_messages(t, [ok, big]))
            assert ok_r == Delivered() and isinstance(big_r, Rejected)
        finally:
            await t.close()


class TestWire:
    async def test_header_block_is_what_nats_py_sends(self) -> None:
        """Our HPUB header block is byte for byte the one nats-py's publish() builds (CR/LF in a value
        become spaces, values are stripped), and the private client methods we publish through exist."""
        headers = {"ce-id": "1", "ce-source": " src ", "ce-subject": "a\r\nInjected: 1", "ce-type": "t\u00e9"}
        captured: list[bytes] = []
        nc = Client()

        async def capture(cmd: bytes, priority: bool = False) -> None:
            captured.append(cmd)

        nc._send_command = capture  # type: ignore[method-assign]
        await nc._send_publish("subj", "reply", b"body", 4, headers)
        first_line, rest = captured[0].split(b"\r\n", 1)
        hdr_len = int(first_line.split()[3])
        assert rest[:hdr_len] == header_block(headers)
        for name in ("_send_command", "_flush_pending", "_flush_queue", "_pending", "_pending_data_size"):
            assert hasattr(Client(), name), f"nats-py no longer has Client.{name}: revisit _acks.py / drop_unsent"

    async def test_staged_publishes_go_out_as_one_command_and_replies_resolve_them(
        self, nats_url: str, stream: tuple[str, str]
    ) -> None:
        """Staged messages are written as one client command (each frame as publish() would write it) and
        their acks come straight from the read loop (the subscription has no message queue task); a
        publish that never gets a reply is forgotten by the next sweep."""
        from outrelay.transports.nats import _acks

        name, prefix = stream
        nc = await nats.connect(nats_url)
        try:
            mux = _acks.AckMux(nc)
            await mux.start()
            assert mux._sub is not None and mux._sub._wait_for_msgs_task is None
            sent: list[bytes] = []
            real = nc._send_command

            async def spy(cmd: bytes, priority: bool = False) -> None:
                sent.append(cmd)
                await real(cmd, priority)

            nc._send_command = spy  # type: ignore[method-assign]
            futures = [mux.stage(f"{prefix}.s", f"m{i}".encode(), {"Nats-Msg-Id": f"id-{i}"}) for i in range(3)]
            assert sent == []  # nothing is written before the flush
            await mux.flush()
            assert len(sent) == 1 and sent[0].count(b"HPUB ") == 3
            acks = await asyncio.wait_for(asyncio.gather(*futures), 5)
            assert [a["seq"] for a in acks] == [1, 2, 3] and {a["stream"] for a in acks} == {name}
            assert mux._pending == {} and mux._subjects == {}
            lost = mux.stage(f"{prefix}.s", b"x", {})  # cancelled before any reply: only a sweep forgets it
            lost.cancel()
            mux._sweep()
            assert mux._pending == {} and mux._subjects == {}
        finally:
            await nc.close()

    async def test_unsent_buffer_is_dropped(self, nats_url: str) -> None:
        """drop_unsent() forgets a published-but-unflushed message: it never reaches the server
        (what keeps a reconnect from sending it after a lost earlier one)."""
        nc = await nats.connect(nats_url)
        try:
            got: list[bytes] = []

            async def on_msg(msg: Msg) -> None:
                got.append(msg.data)

            sub = await nc.subscribe("outrelay.test.drop", cb=on_msg)
            await nc.flush()
            await nc.publish("outrelay.test.drop", b"dropped")  # buffered; the flusher has not run yet
            assert drop_unsent(nc) > 0
            await nc.publish("outrelay.test.drop", b"kept")
            await nc.flush()
            await asyncio.sleep(0.2)
            assert got == [b"kept"]
            await sub.unsubscribe()
        finally:
            await nc.close()


class TestErrors:
    async def test_unreachable_open_is_retryable_and_quick(self) -> None:
        """open() against a port where nothing listens raises RetryableError within a second or two."""
        t = NatsTransport(NatsConfig(servers=(f"nats://u:pw123@127.0.0.1:{free_port()}",), connect_timeout=1))
        started = time.monotonic()
        with pytest.raises(RetryableError) as info:
            await t.open()
        assert time.monotonic() - started < 5
        assert "pw123" not in str(info.value) and "***" in str(info.value)

    async def test_no_stream_for_subject(self, nats_url: str) -> None:
        """Publishing where no stream listens is RetryLater naming the missing stream; check() says how to fix."""
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject="outrelay.nostream.{stream}"))
        await t.open()
        try:
            (r,) = await t.send(_messages(t, [Event(type="t", stream="s")]))
            assert isinstance(r, RetryLater) and "no JetStream stream" in r.error
        finally:
            await t.close()
        with pytest.raises(PermanentError, match=r"no JetStream stream covers the subjects 'outrelay\.nostream\.>'"):
            await t.check()

    async def test_check_with_create_stream_creates_nothing(self, nats_url: str) -> None:
        """With create_stream and no stream yet, check() says the relay will create it, and does not create it."""
        import uuid

        import nats as nats_client

        name = f"OR_CHK_{uuid.uuid4().hex[:8]}".upper()
        spec = {"name": name, "subjects": [f"or.chk.{name.lower()}.>"], "storage": "memory"}
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=f"or.chk.{name.lower()}.x", create_stream=spec))
        line = await t.check()
        assert f"stream {name!r} does not exist yet" in line and "check created nothing" in line
        nc = await nats_client.connect(nats_url)
        try:
            with pytest.raises(nats_client.js.errors.NotFoundError):
                await nc.jetstream().stream_info(name)
        finally:
            await nc.close()

    async def test_wrong_expected_stream_is_rejected(self, nats_url: str, stream: tuple[str, str]) -> None:
        """Nats-Expected-Stream naming another stream is a permanent failure, and later messages of the stream wait."""
        _, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".x", expected_stream="NOT_THIS_ONE"))
        await t.open()
        try:
            a, b = Event(type="t", stream="s"), Event(type="t", stream="s")
            ra, rb = await t.send(_messages(t, [a, b]))
            assert isinstance(ra, Rejected) and "expected_stream" in ra.reason
            assert isinstance(rb, RetryLater)
        finally:
            await t.close()

    async def test_send_after_close(self, nats_url: str) -> None:
        """send() after close() raises UsageError; close() is idempotent."""
        t = NatsTransport(NatsConfig(servers=(nats_url,)))
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send([])


class TestCheck:
    async def test_check_line(self, nats_url: str, stream: tuple[str, str]) -> None:
        """check() names the server, the stream taking the subject and its dedupe window, in one line."""
        name, prefix = stream
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{type}"))
        line = await t.check()
        assert name in line and "dedupe window 60s" in line and "\n" not in line

    async def test_check_unreachable(self) -> None:
        """check() against a dead port raises RetryableError."""
        t = NatsTransport(NatsConfig(servers=(f"nats://127.0.0.1:{free_port()}",), connect_timeout=1))
        with pytest.raises(RetryableError, match="cannot connect"):
            await t.check()

    async def test_create_stream_for_dev(self, nats_url: str, nats_streams: StreamFactory) -> None:
        """create_stream makes the stream at open and declares its duplicate window."""
        import uuid

        tag = uuid.uuid4().hex[:8]
        name = f"OR_DEV_{tag}".upper()
        nats_streams.created.append(name)  # deleted at teardown
        t = NatsTransport(
            NatsConfig(
                servers=(nats_url,),
                subject=f"or.dev.{tag}.{{type}}",
                create_stream={
                    "name": name,
                    "subjects": [f"or.dev.{tag}.>"],
                    "storage": "memory",
                    "duplicate_window": 30,
                },
            )
        )
        assert t.capabilities.dedupe_window == 30
        await t.open()
        try:
            assert await t.send(_messages(t, [Event(type="t", stream="s")])) == [Delivered()]
        finally:
            await t.close()


class TestSecurity:
    async def test_nkey(self, tmp_path: Path) -> None:
        """An NKey seed file authenticates (the server knows only the public key); another
        seed is a PermanentError naming authorization, and no seed appears in it."""
        good_seed, bad_seed = (nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER) for _ in range(2))
        public = nkeys.from_seed(good_seed).public_key.decode()
        conf = tmp_path / "nkey.conf"
        conf.write_text(f'authorization {{ users = [ {{ nkey: "{public}" }} ] }}\n')
        good_file, bad_file = tmp_path / "good.nk", tmp_path / "bad.nk"
        good_file.write_bytes(good_seed)
        bad_file.write_bytes(bad_seed)
        with private_nats_server(tmp_path, ["-c", str(conf)]) as server:
            spec = {"name": "NK", "subjects": ["nk.>"], "storage": "memory"}
            good = NatsTransport(
                NatsConfig(servers=(server.url,), nkey_seed_file=str(good_file), subject="nk.x", create_stream=spec)
            )
            await good.open()
            try:
                assert await good.send(_messages(good, [Event(type="t", stream="s")])) == [Delivered()]
            finally:
                await good.close()
            bad = NatsTransport(NatsConfig(servers=(server.url,), nkey_seed_file=str(bad_file), connect_timeout=1))
            with pytest.raises(PermanentError, match="authorization") as info:
                await bad.open()
            assert bad_seed.decode() not in str(info.value)

    async def test_token(self, tmp_path: Path) -> None:
        """A token authenticates; a wrong one is a PermanentError that never shows the token."""
        with private_nats_server(tmp_path, ["--auth", "s3cret-token"]) as server:
            spec = {"name": "TOK", "subjects": ["tok.>"], "storage": "memory"}
            good = NatsTransport(
                NatsConfig(servers=(server.url,), token="s3cret-token", subject="tok.x", create_stream=spec)
            )
            await good.open()
            try:
                assert await good.send(_messages(good, [Event(type="t", stream="s")])) == [Delivered()]
            finally:
                await good.close()
            bad = NatsTransport(NatsConfig(servers=(server.url,), token="wrong-token", connect_timeout=1))
            with pytest.raises(PermanentError, match="authorization") as info:
                await bad.open()
            assert "wrong-token" not in str(info.value)

    async def test_user_password(self, tmp_path: Path) -> None:
        """user/password authenticate; a wrong password is a PermanentError that never shows the password."""
        with private_nats_server(tmp_path, ["--user", "relay", "--pass", "s3cret-pw"]) as server:
            spec = {"name": "AUTH", "subjects": ["auth.>"], "storage": "memory"}
            good = NatsTransport(
                NatsConfig(
                    servers=(server.url,), user="relay", password="s3cret-pw", subject="auth.x", create_stream=spec
                )
            )
            await good.open()
            try:
                assert await good.send(_messages(good, [Event(type="t", stream="s")])) == [Delivered()]
            finally:
                await good.close()
            bad = NatsTransport(NatsConfig(servers=(server.url,), user="relay", password="wrong-pw", connect_timeout=1))
            with pytest.raises(PermanentError, match="authorization") as info:
                await bad.open()
            assert "wrong-pw" not in str(info.value)

    async def test_tls(self, tmp_path: Path, tls_cert: tuple[Path, Path]) -> None:
        """A tls:// server with a private CA is reached with tls_ca_file, and messages are acked over TLS."""
        cert, key = tls_cert
        args = ["--tls", "--tlscert", str(cert), "--tlskey", str(key)]
        with private_nats_server(tmp_path, args) as server:
            spec = {"name": "TLS", "subjects": ["tls.>"], "storage": "memory"}
            t = NatsTransport(
                NatsConfig(servers=(f"tls://127.0.0.1:{server.port}",), tls_ca_file=str(cert), subject="tls.x",
                           create_stream=spec)
            )  # fmt: skip
            await t.open()
            try:
                assert await t.send(_messages(t, [Event(type="t", stream="s")])) == [Delivered()]
                assert "tls://127.0.0.1" in await t.check()
            finally:
                await t.close()
            untrusted = NatsTransport(NatsConfig(servers=(f"tls://127.0.0.1:{server.port}",), connect_timeout=1))
            with pytest.raises(PermanentError, match=r"certificate was refused .*set tls_ca_file"):
                await untrusted.open()


class TestLifecycle:
    async def test_send_while_reconnecting_is_retryable_then_resumes(self, tmp_path: Path) -> None:
        """While the client reconnects (its server killed) the transport is ``reconnecting`` and send() raises
        RetryableError naming the lost connection, writing nothing; once the server is back it is open again
        and delivers, without a new open()."""
        with private_nats_server(tmp_path) as server:
            spec = {"name": "OR_RECONNECT", "subjects": ["or.reconnect.>"], "storage": "file"}
            t = NatsTransport(
                NatsConfig(servers=(server.url,), subject="or.reconnect.x", create_stream=spec, reconnect_time_wait=0.1)
            )
            await t.open()
            try:
                assert await t.send(_messages(t, [Event(type="t", stream="s")])) == [Delivered()]
                server.kill()
                deadline = time.monotonic() + 10
                while t.state != "reconnecting" and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                assert t.state == "reconnecting"
                with pytest.raises(RetryableError, match="connection lost"):
                    await t.send(_messages(t, [Event(type="t", stream="s")]))
                server.start()
                results: list[object] = []
                deadline = time.monotonic() + 20
                while results != [Delivered()] and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                    if t.state == "open":  # JetStream may need a moment after the reconnect: RetryLater
                        results = list(await t.send(_messages(t, [Event(type="t", stream="s")])))
                assert results == [Delivered()] and t.state == "open"
            finally:
                await t.close()
            assert t.state == "closed"
