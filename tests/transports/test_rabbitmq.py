"""The rabbitmq transport against a real RabbitMQ broker."""

from __future__ import annotations

import asyncio
import os
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import aio_pika
import pytest

from outrelay import Delivered, Event, Message, PermanentError, Rejected, RetryableError, RetryLater, UsageError
from outrelay.core.model import cloudevents
from outrelay.transports.rabbitmq._config import RabbitMQConfig, mask_url
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
from tests.peers.conformance_hooks import long_secret, rabbitmq_users
from tests.peers.proxy import TcpProxy
from tests.peers.rabbitmq import ExchangeFactory
from tests.services import free_port


def _messages(t: RabbitMQTransport, events: list[Event]) -> list[Message]:
    return [Message(e, t.target(e), e.stream) for e in events]


class TestConfig:
    def test_password_never_prints(self) -> None:
        """A password given in the URL or as a SecretStr never shows in reprs or `where`."""
        cfg = RabbitMQConfig(url="amqp://relay:hunter2@h:5672/prod")
        assert "hunter2" not in repr(cfg) and "hunter2" not in cfg.where
        cfg2 = RabbitMQConfig(url="amqp://h/", user="relay", password="s3cret", vhost="a/b")
        assert "s3cret" not in repr(cfg2) and cfg2.where == "amqp://relay:***@h/a%2Fb"
        assert "s3cret" in cfg2.connection_url()
        assert mask_url("amqps://u:p@h/") == "amqps://u:***@h/"

    def test_target_is_exchange_slash_routing_key(self) -> None:
        """target() renders both templates as "exchange/routing key"."""
        t = RabbitMQTransport(RabbitMQConfig(exchange="ev.{category}", routing_key="{tenant}.{type}"))
        assert t.target(Event(type="order.created", stream="s", tenant="acme")) == "ev.order/acme.order.created"


class TestPublish:
    async def test_properties_and_headers(self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory) -> None:
        """A message carries the bytes, content type, message_id = event id, persistence and cloudEvents_* headers."""
        ex = await rabbitmq_exchanges("pub")
        queue = await rabbitmq_exchanges.queue(ex, "k.#")
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex, routing_key="k.{stream}"))
        await t.open()
        ev = Event(type="order.created", stream="o-1", data={"n": 1}, tenant="acme", correlation_id="c-1")
        try:
            assert await t.send(_messages(t, [ev])) == [Delivered()]
        finally:
            await t.close()
        conn = await aio_pika.connect(rabbitmq_url)
        async with conn:
            channel = await conn.channel()
            q = await channel.declare_queue(queue, passive=True)
            msg = await q.get(timeout=5)
            assert msg is not None
            await msg.ack()
        assert msg.body == ev.data and msg.content_type == "application/json"
        assert msg.message_id == ev.id and msg.delivery_mode == aio_pika.DeliveryMode.PERSISTENT
        assert msg.routing_key == "k.o-1" and msg.correlation_id == "c-1"
        headers = {k: str(v) for k, v in (msg.headers or {}).items()}
        assert headers["cloudEvents_id"] == ev.id and headers["cloudEvents_specversion"] == "1.0"
        decoded = cloudevents.from_binary(headers, msg.body, content_type=msg.content_type, prefix="cloudEvents_")
        assert decoded == ev

    @pytest.mark.parametrize("pipeline", [True, False])
    async def test_order_per_stream_via_reader(
        self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory, pipeline: bool
    ) -> None:
        """A batch with many messages per stream is read back in batch order per stream (pipelined or not)."""
        ex = await rabbitmq_exchanges("ord")
        cfg = RabbitMQConfig(url=rabbitmq_url, exchange=ex, routing_key="s.{stream}", pipeline=pipeline)
        t = RabbitMQTransport(cfg)
        await t.open()
        try:
            events = [Event(type="t", stream=f"s{i % 7}", data={"i": i}) for i in range(700)]
            async with t.reader(f"{ex}/s.*") as r:
                assert all(isinstance(x, Delivered) for x in await t.send(_messages(t, events)))
                got = await r.read(700, 10)
            for s in range(7):
                want = [e.id for e in events if e.stream == f"s{s}"]
                assert [g.event.id for g in got if g.event.stream == f"s{s}"] == want
        finally:
            await t.close()

    async def test_reconnects_after_connection_loss(
        self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
    ) -> None:
        """When the connection is lost, the client reconnects by itself: the transport is ``reconnecting``
        meanwhile (sends raise RetryableError at once), then open again, and concurrent sends deliver."""
        ex = await rabbitmq_exchanges("rc")
        await rabbitmq_exchanges.queue(ex, "#")
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex))
        await t.open()
        try:
            assert t._conn is not None and t._conn.transport is not None
            # what a broker restart or a cut socket looks like to the client: its AMQP connection closes under it
            await t._conn.transport.connection.close(ConnectionResetError("cut"))
            states = {t.state}
            for _ in range(200):
                if t.state == "reconnecting":
                    with pytest.raises(RetryableError, match="reconnecting"):
                        await t.send(_messages(t, [Event(type="t", stream="early")]))
                states.add(t.state)
                if "reconnecting" in states and t.state == "open":
                    break
                await asyncio.sleep(0.05)
            assert "reconnecting" in states and t.state == "open", states
            sends = [t.send(_messages(t, [Event(type="t", stream=f"s{i}")])) for i in range(4)]
            assert await asyncio.gather(*sends) == [[Delivered()]] * 4
        finally:
            await t.close()

    async def test_recovers_from_a_cut_connection(self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory) -> None:
        """After the network drops the connection, sends fail retryably at worst (RetryLater, or RetryableError while
        the client reconnects), then deliver again."""
        ex = await rabbitmq_exchanges("cut")
        await rabbitmq_exchanges.queue(ex, "#")
        parts = urlsplit(rabbitmq_url)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
        await proxy.start()
        url = rabbitmq_url.replace(f"{parts.hostname}:{parts.port or 5672}", f"127.0.0.1:{proxy.port}")
        t = RabbitMQTransport(RabbitMQConfig(url=url, exchange=ex, connect_timeout=2, confirm_timeout=2))
        await t.open()
        try:
            assert await t.send(_messages(t, [Event(type="t", stream="s")])) == [Delivered()]
            proxy.cut()
            outcomes: list[object] = []
            for _ in range(50):
                try:
                    (r,) = await t.send(_messages(t, [Event(type="t", stream="s")]))
                except RetryableError as exc:  # reconnecting: refused at once
                    outcomes.append(exc)
                    await asyncio.sleep(0.1)
                    continue
                outcomes.append(r)
                if isinstance(r, Delivered):
                    break
                assert isinstance(r, RetryLater)
                await asyncio.sleep(0.1)
            assert isinstance(outcomes[-1], Delivered), outcomes
        finally:
            await t.close()
            await proxy.stop()

    async def test_close_while_reconnecting_stops_the_client(
        self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
    ) -> None:
        """While the broker is unreachable the transport is ``reconnecting`` (sends raise RetryableError at
        once); close() then stops the client: it connects nowhere once the broker is reachable again."""
        ex = await rabbitmq_exchanges("rcc")
        parts = urlsplit(rabbitmq_url)
        upstream = (parts.hostname or "127.0.0.1", parts.port or 5672)
        proxy = TcpProxy(*upstream)
        await proxy.start()
        url = rabbitmq_url.replace(f"{parts.hostname}:{parts.port or 5672}", f"127.0.0.1:{proxy.port}")
        t = RabbitMQTransport(RabbitMQConfig(url=url, exchange=ex, connect_timeout=1, confirm_timeout=2))
        await t.open()
        again = TcpProxy(*upstream, listen_port=proxy.port)
        try:
            await proxy.stop()  # drops the connection and refuses new ones
            for _ in range(100):
                if t.state == "reconnecting":
                    break
                await asyncio.sleep(0.05)
            assert t.state == "reconnecting"
            with pytest.raises(RetryableError, match="reconnecting"):
                await t.send(_messages(t, [Event(type="t", stream="s")]))
            await t.close()
            assert t.state == "closed"
            await again.start()  # the broker is reachable again: a client still reconnecting would connect
            await asyncio.sleep(1.5)
            assert again.stats["connections"] == 0
        finally:
            await t.close()
            await again.stop()


class TestErrors:
    async def test_unreachable_is_retryable_and_quick(self) -> None:
        """open() against a dead port raises RetryableError quickly, without the password."""
        t = RabbitMQTransport(RabbitMQConfig(url=f"amqp://u:pw123@127.0.0.1:{free_port()}/", connect_timeout=1))
        started = time.monotonic()
        with pytest.raises(RetryableError) as info:
            await t.open()
        assert time.monotonic() - started < 5
        assert "pw123" not in str(info.value) and "u:***@" in str(info.value)

    async def test_bad_password_is_permanent(self, rabbitmq_url: str) -> None:
        """Wrong credentials raise PermanentError that does not contain the password."""
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, user="guest", password="wrong-pw-42"))
        with pytest.raises(PermanentError) as info:
            await t.open()
        assert "wrong-pw-42" not in str(info.value)

    async def test_unknown_vhost_is_permanent(self, rabbitmq_url: str) -> None:
        """A vhost the broker does not have is a PermanentError naming the vhost as the thing to check."""
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, vhost="or-no-such-vhost"))
        with pytest.raises(PermanentError, match="vhost"):
            await t.open()

    @pytest.mark.parametrize("policy", ["permanent", "retryable"])
    async def test_unroutable(self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory, policy: str) -> None:
        """With mandatory, an unroutable message is Rejected or RetryLater as configured; its stream waits."""
        ex = await rabbitmq_exchanges("unr")
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex, unroutable=policy))
        await t.open()
        try:
            a, b = Event(type="t", stream="s"), Event(type="t", stream="s")
            ra, rb = await t.send(_messages(t, [a, b]))
            assert isinstance(ra, Rejected if policy == "permanent" else RetryLater)
            assert "unroutable" in (ra.reason if isinstance(ra, Rejected) else ra.error)
            assert isinstance(rb, RetryLater)
        finally:
            await t.close()

    async def test_full_queue_nack_holds_the_stream(
        self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
    ) -> None:
        """A queue at x-max-length with reject-publish nacks: that message is RetryLater, the later
        messages of its stream are held back, another stream's first message still lands."""
        ex = await rabbitmq_exchanges("full")
        await rabbitmq_exchanges.queue(ex, "#", {"x-max-length": 2, "x-overflow": "reject-publish"})
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex))
        await t.open()
        try:
            a1, a2, a3, a4 = (Event(type="t", stream="a") for _ in range(4))
            results = await t.send(_messages(t, [a1, a2, a3, a4]))
            assert results[:2] == [Delivered(), Delivered()]
            assert all(isinstance(r, RetryLater) for r in results[2:]), results
            assert isinstance(results[3], RetryLater) and "held back" in results[3].error
        finally:
            await t.close()

    async def test_missing_exchange(self, rabbitmq_url: str) -> None:
        """A missing exchange is RetryLater saying how to fix it, and the channel stays usable."""
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange="or-missing-{stream}"))
        await t.open()
        try:
            (r,) = await t.send(_messages(t, [Event(type="t", stream="nope")]))
            assert isinstance(r, RetryLater) and "declare the exchange" in r.error
            assert t._channel is not None and not t._channel.is_closed
        finally:
            await t.close()
        with pytest.raises(PermanentError, match="does not exist"):
            await RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange="or-missing-x")).check()
        cfg = RabbitMQConfig(url=rabbitmq_url, exchange="or-missing-x", declare_exchange=True)
        line = await RabbitMQTransport(cfg).check()  # what run would do: declare it; check itself creates nothing
        assert "does not exist yet" in line and "declare_exchange = true" in line
        with pytest.raises(PermanentError, match="does not exist"):
            await RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange="or-missing-x")).check()

    async def test_oversized_is_rejected(self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory) -> None:
        """Data over max_message_bytes is Rejected before it is sent."""
        ex = await rabbitmq_exchanges("big")
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex, max_message_bytes=10))
        await t.open()
        try:
            (r,) = await t.send(_messages(t, [Event(type="t", stream="s", data=b"x" * 11)]))
            assert isinstance(r, Rejected)
        finally:
            await t.close()

    async def test_send_after_close(self, rabbitmq_url: str) -> None:
        """send() after close() raises UsageError; close() is idempotent."""
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url))
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send([])


class TestCheck:
    async def test_check_line(self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory) -> None:
        """check() names the broker (password masked) and the exchange, in one line."""
        ex = await rabbitmq_exchanges("chk")
        line = await RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex)).check()
        assert ex in line and "guest:***@" in line and "\n" not in line

    async def test_check_publishes_nothing(self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory) -> None:
        """check() proves write permission with a publish it rolls back: a queue bound to every key of the
        exchange stays empty, though the transport's next message lands in it."""
        ex = await rabbitmq_exchanges("chk")
        queue = await rabbitmq_exchanges.queue(ex, "#")
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex))
        line = await t.check()
        assert "publishing to it is permitted" in line and "nothing delivered" in line

        async def depth() -> int:
            async with await aio_pika.connect(rabbitmq_url) as conn:
                q = await (await conn.channel()).declare_queue(queue, passive=True)
                count = q.declaration_result.message_count
                assert count is not None
                return count

        await asyncio.sleep(0.2)  # a stray probe would be routed by now
        assert await depth() == 0
        await t.open()
        try:
            assert await t.send(_messages(t, [Event(type="t", stream="s")])) == [Delivered()]
        finally:
            await t.close()
        assert await depth() == 1  # the binding catches what is published to the exchange

    async def test_check_says_bindings_are_not_checked(
        self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
    ) -> None:
        """An exchange with no queue bound passes check, but the line says bindings were not checked and that
        such events are dead-lettered as unroutable, which the next send shows."""
        ex = await rabbitmq_exchanges("chk")
        t = RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex))
        line = await t.check()
        assert "NOT checked: that a queue is bound" in line and "dead-lettered as unroutable" in line
        assert "rabbitmqctl list_bindings -p / " in line
        await t.open()
        try:
            (r,) = await t.send(_messages(t, [Event(type="t", stream="s")]))
            assert isinstance(r, Rejected) and "unroutable" in r.reason
        finally:
            await t.close()

    async def test_check_without_write_permission(self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory) -> None:
        """A user who may connect but not publish fails check() with a PermanentError naming the user, vhost,
        exchange and the rabbitmqctl fix, never the password."""
        if os.environ.get("OUTRELAY_RABBITMQ_URL"):
            pytest.skip("rabbitmqctl manages the local broker, not OUTRELAY_RABBITMQ_URL's")
        ex = await rabbitmq_exchanges("chk")
        user, password = f"outrelay-chk-{uuid.uuid4().hex[:8]}", long_secret()
        users = rabbitmq_users(password, {user: ""})
        problem = next(users)
        try:
            if problem is not None:
                pytest.skip(problem)
            host = urlsplit(rabbitmq_url).netloc.rpartition("@")[2]
            cfg = RabbitMQConfig(url=f"amqp://{user}@{host}/", password=password, exchange=ex)
            with pytest.raises(PermanentError) as info:
                await RabbitMQTransport(cfg).check()
        finally:
            next(users, None)
        text = str(info.value)
        assert f"user {user!r} lacks write permission on vhost '/' for exchange {ex!r}" in text, text
        assert f"rabbitmqctl set_permissions -p / {user}" in text and "\n" not in text
        assert password not in text and password not in repr(info.value.__cause__)

    async def test_check_unreachable(self) -> None:
        """check() against a dead port raises RetryableError."""
        t = RabbitMQTransport(RabbitMQConfig(url=f"amqp://127.0.0.1:{free_port()}/", connect_timeout=1))
        with pytest.raises(RetryableError, match="cannot connect"):
            await t.check()


class TestTls:
    async def test_tls_to_the_broker(
        self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory, tls_cert: tuple[Path, Path]
    ) -> None:
        """amqps with tls_ca_file: the broker (behind a TLS-terminating proxy on 127.0.0.1) gets the
        message; without that CA the certificate is refused, with one line that says so."""
        ex = await rabbitmq_exchanges("tls")
        parts = urlsplit(rabbitmq_url)
        proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672, tls=tls_cert)
        await proxy.start()
        url = rabbitmq_url.replace(f"{parts.hostname}:{parts.port or 5672}", f"127.0.0.1:{proxy.port}")
        try:
            t = RabbitMQTransport(RabbitMQConfig(url=url, exchange=ex, tls_ca_file=str(tls_cert[0])))
            await t.open()
            try:
                ev = Event(type="t", stream="s")
                async with RabbitMQTransport(RabbitMQConfig(url=rabbitmq_url, exchange=ex)).reader(f"{ex}/#") as r:
                    assert await t.send(_messages(t, [ev])) == [Delivered()]
                    (got,) = await r.read(1, 5)
                assert got.event.id == ev.id
            finally:
                await t.close()
            untrusted = RabbitMQTransport(RabbitMQConfig(url=url, exchange=ex, tls=True, connect_timeout=2))
            with pytest.raises(PermanentError, match=r"certificate was refused .*self-signed.*set tls_ca_file"):
                await untrusted.open()
        finally:
            await proxy.stop()
