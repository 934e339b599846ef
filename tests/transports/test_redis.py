"""Integration tests of the redis transport against a real Redis (127.0.0.1:6379 or OUTRELAY_REDIS_URL)."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from outrelay import Event, Message, PermanentError, Rejected, RetryableError, RetryLater, UsageError
from outrelay.core.contract.progress import Progress, sending
from outrelay.core.contract.transport import Delivered, NotSent
from outrelay.core.model import cloudevents
from outrelay.transports.redis._batch import HELD
from outrelay.transports.redis._reader import decode
from outrelay.transports.redis._transport import RedisConfig, RedisTransport, encode
from tests.peers.proxy import TcpProxy
from tests.peers.redis import OwnRedis


def make(url: str, stream: str, **extra: object) -> RedisTransport:
    return RedisTransport(RedisConfig.model_validate({"url": url, "stream": stream, **extra}), destination="r")


def msg(t: RedisTransport, ev: Event) -> Message:
    return Message(ev, t.target(ev), ev.stream)


def key() -> str:
    # no ':' — a key template escapes it in a {tenant} value (tenant isolation), and tests use keys as tenants
    return f"outrelay-test-{uuid.uuid4().hex[:10]}"


@pytest.fixture(autouse=True)
async def _delete_test_keys(redis_url: str) -> AsyncIterator[None]:
    """Leave the shared Redis as it was: drop every key these tests created."""
    yield
    client = aioredis.Redis.from_url(redis_url)
    keys = [k async for k in client.scan_iter(match="outrelay-test-*", count=1000)]  # key()'s names
    if keys:
        await client.delete(*keys)
    await client.aclose()


class TestRedisSend:
    async def test_binary_mode_round_trip(self, redis_url: str) -> None:
        """Binary mode stores ce_* fields, content-type and data verbatim; the reader rebuilds the event."""
        k = key()
        t = make(redis_url, k)
        await t.open()
        try:
            ev = Event(type="order.created", stream="order-1", data={"n": 1}, tenant="acme", labels={"x": "y"})
            async with t.reader(k) as r:
                assert await t.send([msg(t, ev)]) == [Delivered()]
                got = await r.read(1, 5)
        finally:
            await t.close()
        assert got[0].body == ev.data
        assert got[0].headers["ce_id"] == ev.id and got[0].headers["content-type"] == "application/json"
        assert got[0].key == "order-1"
        assert got[0].event == ev

    async def test_structured_mode_round_trip(self, redis_url: str) -> None:
        """Structured mode stores the JSON CloudEvent under data with the cloudevents content type."""
        k = key()
        t = make(redis_url, k, mode="structured")
        await t.open()
        try:
            ev = Event(type="x", stream="s", data=b"\xff\x00")
            async with t.reader(k) as r:
                await t.send([msg(t, ev)])
                got = await r.read(1, 5)
        finally:
            await t.close()
        assert got[0].content_type == cloudevents.STRUCTURED_CONTENT_TYPE
        assert got[0].event == ev

    @pytest.mark.parametrize("batching", ["script", "pipeline"])
    async def test_deep_batch_keeps_order(self, redis_url: str, batching: str) -> None:
        """A batch with many events per stream is appended in per-stream order (both batching modes)."""
        k = key()
        t = make(redis_url, k, batching=batching)
        events = [Event(type="t", stream=f"s{i % 3}", data={"i": i}) for i in range(300)]
        await t.open()
        try:
            async with t.reader(k) as r:
                assert await t.send([msg(t, e) for e in events]) == [Delivered()] * 300
                got = await r.read(300, 5)
        finally:
            await t.close()
        assert [g.event.id for g in got] == [e.id for e in events]

    @pytest.mark.parametrize("batching", ["script", "pipeline"])
    async def test_failure_holds_later_events_of_the_stream(self, redis_url: str, batching: str) -> None:
        """A WRONGTYPE XADD is Rejected, later events of that stream RetryLater (not appended), others Delivered."""
        bad = key()
        good = key()
        client = aioredis.Redis.from_url(redis_url)
        await client.set(bad, "not a stream")
        t = make(redis_url, "{tenant}", batching=batching)
        await t.open()
        try:
            # one event stream "s" whose events go to different keys: the bad key first, then a good one
            batch = [
                Event(type="t", stream="s", tenant=bad),
                Event(type="t", stream="other", tenant=good),
                Event(type="t", stream="s", tenant=good),
            ]
            res = await t.send([msg(t, e) for e in batch])
            appended = await client.xlen(good)
        finally:
            await t.close()
            await client.delete(bad, good)
            await client.aclose()
        assert isinstance(res[0], Rejected) and "WRONGTYPE" in res[0].reason
        assert res[1] == Delivered()
        assert isinstance(res[2], RetryLater)
        assert appended == 1

    async def test_large_batch_is_split_in_order(self, redis_url: str) -> None:
        """A batch of 12 MB goes out in several bounded script calls and keeps its order."""
        k = key()
        t = make(redis_url, k)
        events = [Event(type="t", stream=f"s{i % 2}", data=bytes([i]) * 1_000_000) for i in range(12)]
        await t.open()
        try:
            async with t.reader(k) as r:
                assert await t.send([msg(t, e) for e in events]) == [Delivered()] * 12
                got = await r.read(12, 5)
        finally:
            await t.close()
        assert [g.event.id for g in got] == [e.id for e in events]
        assert got[-1].body == events[-1].data

    @pytest.mark.parametrize("batching", ["script", "pipeline"])
    async def test_progress_per_round_trip_and_none_after_a_stop(self, redis_url: str, batching: str) -> None:
        """Each chunk's (script) or wave's (pipeline) outcomes are in the send's progress as soon as its reply
        arrived, and once the relay stops no later one is started: its messages are NotSent and nothing of
        them reaches the stream."""
        k = key()
        t = make(redis_url, k, batching=batching)
        events = [Event(type="t", stream=f"s{i % 2}", data=bytes([i]) * 1_000_000) for i in range(12)]
        batch = [msg(t, e) for e in events]
        seen: list[int] = []

        class StopAfterFirstRoundTrip(Progress):
            def may_start(self, expected: float = 0.0) -> bool:
                seen.append(sum(isinstance(self.outcome(m), Delivered) for m in batch))
                self.stop()  # the relay is shutting down
                return super().may_start(expected)

        await t.open()
        try:
            with sending(StopAfterFirstRoundTrip()) as progress:
                results = await t.send(batch)
            stored = await t._client.xlen(k)  # type: ignore[union-attr]
        finally:
            await t.close()
        first = sum(isinstance(r, Delivered) for r in results)
        assert seen and seen[0] == first > 0, (seen, first)  # recorded before the next chunk was considered
        assert results[:first] == [Delivered()] * first and 0 < first < len(batch)
        assert all(isinstance(r, NotSent) for r in results[first:]), results
        assert [progress.outcome(m) for m in batch] == results
        assert stored == first

    async def test_oversized_is_rejected(self, redis_url: str) -> None:
        """Data over max_message_bytes is Rejected without being sent."""
        k = key()
        t = make(redis_url, k, max_message_bytes=10)
        await t.open()
        try:
            res = await t.send([msg(t, Event(type="t", stream="s", data=b"x" * 11))])
        finally:
            await t.close()
        assert isinstance(res[0], Rejected)

    async def test_maxlen_trims(self, redis_url: str) -> None:
        """maxlen trims the stream approximately (MAXLEN ~) to about that many entries."""
        k = key()
        t = make(redis_url, k, maxlen=100)
        await t.open()
        try:
            await t.send([msg(t, Event(type="t", stream=f"s{i}")) for i in range(1000)])
            client = aioredis.Redis.from_url(redis_url)
            length = await client.xlen(k)
            await client.delete(k)
            await client.aclose()
        finally:
            await t.close()
        assert 100 <= length < 1000

    async def test_hash_tag_template(self, redis_url: str) -> None:
        """Doubled braces in the template render a Redis Cluster hash tag around the stream."""
        t = make(redis_url, "events:{{{stream}}}")
        assert t.target(Event(type="t", stream="order-42")) == "events:{order-42}"

    async def test_no_native_dedupe_before_8_6(self, redis_url: str) -> None:
        """Against Redis < 8.6 the transport declares no native dedupe (IDMP needs 8.6)."""
        t = make(redis_url, key())
        await t.open()
        await t.close()
        assert t.server_version is not None
        assert t.capabilities.native_dedupe == (t.server_version >= (8, 6))


def packing_events(tenant: str) -> list[Event]:
    """Events that stress the script's packing: non-ASCII attributes, separators, empty and
    binary data (':' and NUL bytes), different attribute sets (shapes) in one chunk."""
    return [
        Event(
            type="order.created",
            stream="ström-1",
            source="urn:ünïcode:источник",
            subject='zé ✓ 🙂 \u2028\u00a0 "q" \\ :3:',  # control characters are refused by Event itself
            tenant=tenant,
            labels={"ключ": "значение", "emoji": "🙂"},
            tags=("tag ✓", "t:2"),
            metadata={"m": "\u2028"},
            data={"текст": "ü"},
        ),
        Event(type="t", stream="ström-1", tenant=tenant),  # empty data, no content type
        Event(type="t", stream="s2", tenant=tenant, data=b"", content_type="application/octet-stream"),
        Event(type="t", stream="s2", tenant=tenant, data=b"3:a:\x00b:\x00\xff\r\n", correlation_id="c:1"),
        Event(type="t", stream="s3", tenant=tenant, data="grüße: 🙂", sequence=42, subject="x"),
        Event(type="t", stream="s3", tenant=tenant, data=bytes(range(256)) * 3),
    ]


class TestRedisPacking:
    @pytest.mark.parametrize("batching", ["script", "pipeline"])
    @pytest.mark.parametrize("mode", ["binary", "structured"])
    async def test_entries_are_exactly_the_encoded_fields(self, redis_url: str, mode: str, batching: str) -> None:
        """Each entry holds exactly encode(event, mode) — same names, values (bytes) and order — for
        non-ASCII attributes, empty data, binary data with ':' and NUL bytes,
        several attribute sets and two stream keys in one call; the reader rebuilds every event."""
        keys = [key(), key()]
        t = make(redis_url, "{tenant}", mode=mode, batching=batching, maxlen=1000)
        batch = [e for k in keys for e in packing_events(k)]
        batch = batch[::2] + batch[1::2]  # interleave the two keys, keeping each stream's order
        client = aioredis.Redis.from_url(redis_url)
        await t.open()
        try:
            assert await t.send([msg(t, e) for e in batch]) == [Delivered()] * len(batch)
            stored = {k: await client.xrange(k) for k in keys}
        finally:
            await t.close()
            await client.aclose()
        for k in keys:
            expected = [e for e in batch if e.tenant == k]
            assert len(stored[k]) == len(expected)
            for ev, (_id, fields) in zip(expected, stored[k], strict=True):
                want = [(n.encode(), v if isinstance(v, bytes) else v.encode()) for n, v in encode(ev, mode).items()]
                assert list(fields.items()) == want
                assert decode(k, fields).event == ev

    @pytest.mark.parametrize("batching", ["script", "pipeline"])
    async def test_idmp_options_reach_xadd(self, redis_url: str, batching: str) -> None:
        """With IDMP on, every XADD carries IDMP producer_id event_id: on Redis >= 8.6 a re-sent event is
        not appended again; an older server refuses the option (Rejected, the stream's later event held)."""
        k = key()
        t = make(redis_url, k, batching=batching, maxlen=1000)
        await t.open()
        t._idmp = True  # forced, to exercise the option on any server
        client = aioredis.Redis.from_url(redis_url)
        try:
            batch = [Event(type="t", stream="s", subject="ü"), Event(type="t", stream="s")]
            first = await t.send([msg(t, e) for e in batch])
            again = await t.send([msg(t, e) for e in batch])
            length = await client.xlen(k)
        finally:
            await t.close()
            await client.aclose()
        assert t.server_version is not None
        if t.server_version >= (8, 6):
            assert first == again == [Delivered(), Delivered()]
            assert length == 2
        else:
            assert isinstance(first[0], Rejected) and first[1] == RetryLater(HELD)
            assert length == 0


class TestRedisLifecycle:
    async def test_send_after_close_is_usage_error(self, redis_url: str) -> None:
        """send() after close() raises UsageError and close() is idempotent."""
        t = make(redis_url, key())
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send([msg(t, Event(type="t", stream="s"))])

    async def test_unreachable_is_retryable_quickly(self) -> None:
        """open() against a port where nothing listens raises RetryableError quickly."""
        t = make("redis://127.0.0.1:1/0", "x")
        started = time.monotonic()
        with pytest.raises(RetryableError, match=r"127\.0\.0\.1:1"):
            await t.open()
        assert time.monotonic() - started < 3

    async def test_check_line(self, redis_url: str) -> None:
        """check() returns one line with the version and the stream's publish status."""
        line = await make(redis_url, key()).check()
        assert "\n" not in line and "reachable (Redis" in line and "will be created" in line

    async def test_check_wrong_type(self, redis_url: str) -> None:
        """check() fails with a how-to-fix message when the key is not a stream."""
        k = key()
        client = aioredis.Redis.from_url(redis_url)
        await client.set(k, "x")
        try:
            with pytest.raises(PermanentError, match="not a stream"):
                await make(redis_url, k).check()
        finally:
            await client.delete(k)
            await client.aclose()


class TestRedisConformanceHooks:
    async def test_cleanup_and_foreign_entry(self, redis_url: str) -> None:
        """conformance_publish_foreign appends an entry that is no CloudEvent; conformance_cleanup deletes the
        configured key and its groups' gate lists, and nothing else."""
        k = key()
        t = make(redis_url, k)
        other = aioredis.Redis.from_url(redis_url)
        await t.open()
        try:
            await t.conformance_publish_foreign()
            [(_, fields)] = await other.xrange(k)
            assert fields == {b"hello": b"world"}
            await other.rpush(f"{k}:gate:1:g:s", "1-0")
            await other.set(f"{k}-neighbour", "stays")
            await t.conformance_cleanup()
            assert await other.exists(k, f"{k}:gate:1:g:s") == 0
            assert await other.get(f"{k}-neighbour") == b"stays"
        finally:
            await t.close()
            await other.delete(f"{k}-neighbour")
            await other.aclose()


class TestRedisErrors:
    def test_classification(self) -> None:
        """WRONGTYPE, NOPERM and syntax errors are Rejected; OOM, LOADING, READONLY, TRYAGAIN, I/O errors RetryLater."""
        from redis import exceptions as rx

        from outrelay.transports.redis._errors import result_for

        for exc in (
            rx.ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value"),
            rx.NoPermissionError("NOPERM this user has no permissions"),
            rx.ResponseError("ERR syntax error"),
        ):
            assert isinstance(result_for(exc), Rejected), exc
        for exc in (
            rx.OutOfMemoryError("OOM command not allowed"),
            rx.BusyLoadingError("LOADING"),
            rx.ReadOnlyError("READONLY You can't write against a read only replica."),
            rx.TryAgainError("TRYAGAIN"),
            rx.ConnectionError("Connection closed by server."),
            rx.TimeoutError("Timeout reading from socket"),
        ):
            assert isinstance(result_for(exc), RetryLater), exc

    async def test_server_killed_mid_session_is_retryable(self, own_redis: OwnRedis) -> None:
        """After the server dies, send() raises RetryableError (not a vendor error) and works again after a restart."""
        t = make(own_redis.url, "k", connect_timeout=0.5, socket_timeout=1.0)
        await t.open()
        try:
            ev = Event(type="t", stream="s")
            assert await t.send([msg(t, ev)]) == [Delivered()]
            own_redis.kill()
            with pytest.raises(RetryableError):
                await t.send([msg(t, ev)])
            own_redis.start()
            assert await t.send([msg(t, ev)]) == [Delivered()]
        finally:
            await t.close()


class TestRedisAcl:
    async def test_acl_user_permissions(self, own_redis: OwnRedis) -> None:
        """An ACL user with only +xadd: check() names the missing script permission, pipeline batching works,
        a key outside the user's pattern is Rejected with NOPERM, and a wrong password is a PermanentError."""
        admin = aioredis.Redis.from_url(own_redis.url)
        await admin.acl_setuser(
            "relay",
            enabled=True,
            passwords=["+s3cret"],
            keys=["events:*"],
            commands=["+xadd", "+info", "+ping", "+acl|whoami", "+acl|dryrun", "+type"],
        )
        await admin.aclose()
        base = {"username": "relay", "password": "s3cret"}
        with pytest.raises(PermanentError, match="EVALSHA") as info:
            await make(own_redis.url, "events:a", **base).check()
        assert "s3cret" not in str(info.value)
        t = make(own_redis.url, "{tenant}:s", batching="pipeline", **base)  # a tenant cannot carry ':' into the key
        assert "may XADD" in await make(own_redis.url, "events:a", batching="pipeline", **base).check()
        await t.open()
        try:
            res = await t.send(
                [
                    msg(t, Event(type="t", stream="s", tenant="events")),
                    msg(t, Event(type="t", stream="x", tenant="secret")),
                ]
            )
        finally:
            await t.close()
        assert res[0] == Delivered()
        assert isinstance(res[1], Rejected) and "no permissions" in res[1].reason and "+xadd" in res[1].reason
        # a wrong password fails open() permanently, without echoing it
        with pytest.raises(PermanentError) as info:
            await make(own_redis.url, "k", username="relay", password="nope-not-it").open()
        assert "nope-not-it" not in str(info.value)


class TestRedisConfig:
    def test_password_in_url_refused(self) -> None:
        """A password inside the URL is refused so it cannot leak into messages."""
        with pytest.raises(ValueError, match="password"):
            RedisConfig(url="redis://u:secret@h:6379/0")

    def test_password_is_masked(self) -> None:
        """The password never appears in the config's repr."""
        cfg = RedisConfig(password="hunter2")  # type: ignore[arg-type]
        assert "hunter2" not in repr(cfg)


class TestRedisTls:
    async def test_tls_to_the_server(self, redis_url: str, tls_cert: tuple[Path, Path]) -> None:
        """rediss:// with ssl_ca_certs: the server (behind a TLS-terminating proxy on 127.0.0.1) gets the
        entry; without that CA the certificate is refused, with one line that says so."""
        parts = urlsplit(redis_url)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 6379, tls=tls_cert)
        await proxy.start()
        url = f"rediss://127.0.0.1:{proxy.port}{parts.path or '/0'}"
        k = key()
        try:
            t = make(url, k, ssl_ca_certs=str(tls_cert[0]))
            await t.open()
            try:
                ev = Event(type="t", stream="s")
                assert await t.send([msg(t, ev)]) == [Delivered()]
            finally:
                await t.close()
            client = aioredis.Redis.from_url(redis_url)
            try:
                entries = await client.xrange(k)
            finally:
                await client.aclose()
            assert [decode(k, fields).event.id for _, fields in entries] == [ev.id]
            untrusted = make(url, k)
            with pytest.raises(PermanentError, match=r"certificate was refused .*set ssl_ca_certs"):
                await untrusted.open()
        finally:
            await proxy.stop()
