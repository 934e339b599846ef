"""The ``servicebus`` transport through the real azure-servicebus SDK.

Against the AMQP 1.0 wire-protocol test peer (not Azure Service Bus) by
default, against a real namespace when OUTRELAY_SERVICEBUS_CONNECTION_STRING is set.
"""

from __future__ import annotations

import asyncio
import gc
import socket
import time
import uuid
import warnings
from collections import defaultdict
from collections.abc import Awaitable, Callable

import pytest

from outrelay import Event, Message, RetryableError, TransportError, UsageError
from outrelay.conformance._proxy import TcpProxy
from outrelay.core.contract.transport import Delivered, NotSent, Rejected, RetryLater
from outrelay.kit import Progress, redact, sending
from outrelay.transports.servicebus._config import ServiceBusConfig
from outrelay.transports.servicebus._transport import ServiceBusTransport
from tests.peers.amqp_servicebus_peer import ServiceBusEnv, connection_string
from tests.services import free_port


def _name() -> str:
    return f"q-{uuid.uuid4().hex[:10]}"


def _transport(env: ServiceBusEnv, queue: str, **options: object) -> ServiceBusTransport:
    cfg = ServiceBusConfig(connection_string=env.connection_string, queue=queue, **options)  # type: ignore[arg-type]
    return ServiceBusTransport(cfg)


def _msgs(events: list[Event], queue: str) -> list[Message]:
    return [Message(e, queue, e.stream) for e in events]


class TestMapping:
    async def test_amqp_cloudevents_binding_and_ids(self, servicebus_env: ServiceBusEnv) -> None:
        """Body untouched, cloudEvents_* application properties, content type, MessageId = id, SessionId = stream."""
        queue = await servicebus_env.provision(_name(), sessions=True)
        t = _transport(servicebus_env, queue, sessions=True)
        event = Event(type="order.created", stream="order-7", data={"a": 1}, tenant="acme", labels={"k": "v"})
        await t.open()
        try:
            async with t.reader(queue) as reader:
                assert await t.send(_msgs([event], queue)) == [Delivered()]
                (got,) = await reader.read(1, 10)
        finally:
            await t.close()
        assert got.body == event.data
        assert got.key == "order-7"
        assert got.headers["message_id"] == event.id
        assert got.headers["cloudEvents_id"] == event.id and got.headers["cloudEvents_tenantid"] == "acme"
        assert got.content_type == "application/json"
        assert got.event == event

    async def test_large_send_splits_into_entity_sized_batches(self, servicebus_env: ServiceBusEnv) -> None:
        """600 messages of 2 KB (several 256 KB batches) all arrive, in order per session."""
        queue = await servicebus_env.provision(_name(), sessions=True)
        t = _transport(servicebus_env, queue, sessions=True)
        events = [
            Event(
                type="t",
                stream=f"s{i % 3}",
                data=b"x" * 2000 + str(i).encode(),
                content_type="application/octet-stream",
            )
            for i in range(600)
        ]
        await t.open()
        try:
            async with t.reader(queue) as reader:
                results = await t.send(_msgs(events, queue))
                got = await reader.read(600, 30)
        finally:
            await t.close()
        assert results == [Delivered()] * 600
        seen: dict[str, list[str]] = defaultdict(list)
        for g in got:
            seen[g.key or ""].append(g.event.id)
        for s in ("s0", "s1", "s2"):
            assert seen[s] == [e.id for e in events if e.stream == s]

    async def test_progress_per_service_bus_batch(self, servicebus_env: ServiceBusEnv) -> None:
        """Each Service Bus batch's outcome is reported to the send's progress as the broker answers it; a
        later batch is not started once the deadline is too near (deferred, nothing sent), nor once stopping."""
        queue = await servicebus_env.provision(_name(), sessions=True)
        t = _transport(servicebus_env, queue, sessions=True)
        events = [Event(type="t", stream="s", data=b"x" * 2000 + str(i).encode()) for i in range(300)]
        batch = _msgs(events, queue)
        await t.open()
        try:
            async with t.reader(queue) as reader:
                stopped = Progress()
                stopped.stop()
                with sending(stopped):
                    assert all(isinstance(r, NotSent) for r in await t.send(batch))
                tight = Progress(deadline=asyncio.get_running_loop().time() + 0.001)
                with sending(tight):
                    results = await t.send(batch)
                delivered = [r for r in results if isinstance(r, Delivered)]
                got = await reader.read(len(delivered), 10)
                got += await reader.read(1, 0.5)  # nothing more: deferred messages were not sent
        finally:
            await t.close()
        assert 0 < len(delivered) < 300  # the first batch (~120 messages of 2 KB) only
        assert results == [Delivered()] * len(delivered) + [results[-1]] * (300 - len(delivered))
        assert isinstance(results[-1], NotSent) and tight.declined
        assert [tight.outcome(m) for m in batch[: len(delivered)]] == delivered
        assert [g.event.id for g in got] == [e.id for e in events[: len(delivered)]]

    async def test_size_limits(self, servicebus_env: ServiceBusEnv) -> None:
        """Exactly max_message_bytes is delivered, one byte more is Rejected, and so is what no empty batch holds."""
        queue = await servicebus_env.provision(_name())
        t = _transport(servicebus_env, queue, max_message_bytes=50_000)
        loose = _transport(servicebus_env, queue, max_message_bytes=10_000_000)

        def ev(n: int) -> Event:
            return Event(type="t", stream=f"s{n}", data=b"x" * n, content_type="application/octet-stream")

        await t.open()
        await loose.open()
        try:
            results = await t.send(_msgs([ev(50_000), ev(50_001)], queue))
            (huge,) = await loose.send(_msgs([ev(300_000)], queue))
        finally:
            await t.close()
            await loose.close()
        assert isinstance(results[0], Delivered) and isinstance(results[1], Rejected)
        assert isinstance(huge, Rejected) and "does not fit" in huge.reason

    async def test_duplicate_detection_drops_a_resent_id(self, servicebus_env: ServiceBusEnv) -> None:
        """On an entity with duplicate detection, the same event sent twice is stored once."""
        queue = await servicebus_env.provision(_name(), dedupe=True)
        t = _transport(servicebus_env, queue, duplicate_detection=True, dedupe_window=servicebus_env.dedupe_window)
        event = Event(type="t", stream="s", data={"x": 1})
        assert t.capabilities.native_dedupe and t.capabilities.dedupe_window == servicebus_env.dedupe_window
        await t.open()
        try:
            async with t.reader(queue) as reader:
                assert await t.send(_msgs([event], queue)) == [Delivered()]
                assert await t.send(_msgs([event], queue)) == [Delivered()]
                got = await reader.read(2, 3)
        finally:
            await t.close()
        assert [g.event.id for g in got] == [event.id]


class TestTopics:
    async def test_topic_fans_out_to_subscriptions(self, servicebus_env: ServiceBusEnv) -> None:
        """A topic destination sends once; each subscription's reader gets the event."""
        peer = servicebus_env.require_peer("creating a topic")
        topic = "t-" + uuid.uuid4().hex[:8]
        peer.create_topic(topic)
        peer.create_subscription(topic, "a")
        peer.create_subscription(topic, "b")
        cfg = ServiceBusConfig(connection_string=servicebus_env.connection_string, topic=topic)
        t = ServiceBusTransport(cfg)
        event = Event(type="t", stream="s", data={"x": 1})
        await t.open()
        try:
            assert await t.send(_msgs([event], topic)) == [Delivered()]
        finally:
            await t.close()
        for sub in ("a", "b"):
            async with t.reader(topic, subscription=sub) as reader:
                (got,) = await reader.read(1, 10)
            assert got.event == event

    def test_topic_reader_needs_a_subscription(self) -> None:
        """reader() of a topic without subscription= is a UsageError."""
        t = ServiceBusTransport(ServiceBusConfig(connection_string=connection_string(1), topic="t"))
        with pytest.raises(UsageError, match="subscription"):
            t.reader("t")


class TestCapabilities:
    def test_declared_from_entity_properties(self) -> None:
        """Ordering is declared only with sessions, dedupe only with duplicate_detection."""
        base = {"connection_string": connection_string(1), "queue": "q"}
        plain = ServiceBusTransport(ServiceBusConfig(**base)).capabilities  # type: ignore[arg-type]
        full = ServiceBusTransport(
            ServiceBusConfig(**base, sessions=True, duplicate_detection=True, dedupe_window=30)  # type: ignore[arg-type]
        ).capabilities
        assert not plain.ordering_by_key and not plain.native_dedupe and plain.dedupe_window is None
        assert full.ordering_by_key and full.native_dedupe and full.dedupe_window == 30

    def test_config_needs_one_entity_and_one_credential(self) -> None:
        """queue xor topic, connection_string xor fully_qualified_namespace."""
        with pytest.raises(ValueError, match="queue or topic"):
            ServiceBusConfig(connection_string=connection_string(1))
        with pytest.raises(ValueError, match="connection_string or fully_qualified_namespace"):
            ServiceBusConfig(queue="q")

    def test_secrets_never_printed(self) -> None:
        """The connection string is a SecretStr; SharedAccessKey and SAS signatures are masked in any text."""
        conn = connection_string(1).replace("SAS_KEY_VALUE", "s3cr3t-key")
        cfg = ServiceBusConfig(connection_string=conn, queue="q")
        assert "s3cr3t" not in repr(cfg) and "s3cr3t" not in repr(ServiceBusTransport(cfg))
        assert "s3cr3t" not in redact(f"failed: {conn}")
        assert "s3cr3t" not in redact("Endpoint=sb://x;SharedAccessKey=s3cr3t-key;")
        sas = "SharedAccessSignature=SharedAccessSignature sr=sb%3a%2f%2fx&sig=s3cr3t%3d&se=1&skn=Root"
        assert "s3cr3t" not in redact(f"Endpoint=sb://x;{sas}")


class TestFailures:
    async def test_server_busy_is_retry_later_and_holds_the_key(self, servicebus_env: ServiceBusEnv) -> None:
        """A server-busy answer gives RetryLater(busy_retry_after) and no later message of that key is sent."""
        peer = servicebus_env.require_peer("server-busy")
        queue = await servicebus_env.provision(_name(), sessions=True)
        t = _transport(servicebus_env, queue, sessions=True, busy_retry_after=0.25, max_message_bytes=200_000)
        big = [
            Event(type="t", stream="k", data=b"x" * 150_000, content_type="application/octet-stream") for _ in range(3)
        ]
        await t.open()
        try:
            async with t.reader(queue) as reader:
                peer.server_busy(every=2, count=1)  # the second transfer (second batch) is refused
                results = await t.send(_msgs(big, queue))
                got = await reader.read(3, 2)
        finally:
            await t.close()
        assert isinstance(results[0], Delivered)
        assert isinstance(results[1], RetryLater) and results[1].retry_after == 0.25
        assert "busy" in results[1].error
        assert isinstance(results[2], RetryLater)
        assert [g.event.id for g in got] == [big[0].id]

    async def test_missing_queue_is_retryable(self, servicebus_env: ServiceBusEnv) -> None:
        """Sending to an entity that does not exist gives RetryLater that says to create it."""
        t = _transport(servicebus_env, "missing-" + _name())
        with pytest.raises(TransportError, match="not found"):
            await t.check()


class TestLifecycle:
    async def test_open_unreachable_is_retryable_and_bounded(self) -> None:
        """open() against a port where nothing listens raises RetryableError quickly, without the key."""
        cfg = ServiceBusConfig(connection_string=connection_string(free_port()), queue="q", open_timeout=3)
        started = time.monotonic()
        with pytest.raises(RetryableError) as info:
            await ServiceBusTransport(cfg).open()
        assert time.monotonic() - started < 6
        assert "SAS_KEY_VALUE" not in str(info.value)

    async def test_send_after_close_and_idempotent_close(self, servicebus_env: ServiceBusEnv) -> None:
        """close() twice is fine; send() after close raises UsageError."""
        queue = await servicebus_env.provision(_name())
        t = _transport(servicebus_env, queue)
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send(_msgs([Event(type="t", stream="s")], queue))

    async def test_check(self, servicebus_env: ServiceBusEnv) -> None:
        """check() attaches a sender and says so in one line."""
        queue = await servicebus_env.provision(_name())
        line = await _transport(servicebus_env, queue).check()
        assert queue in line and "\n" not in line

    async def test_check_leaves_an_open_transport_open(self, servicebus_env: ServiceBusEnv) -> None:
        """check() on an open transport reuses its sender and leaves it open: a send right after is delivered."""
        queue = await servicebus_env.provision(_name())
        t = _transport(servicebus_env, queue)
        await t.open()
        try:
            assert queue in await t.check()
            assert t.is_open
            assert await t.send(_msgs([Event(type="t", stream="s")], queue)) == [Delivered()]
        finally:
            await t.close()


def _open_writers(port: int) -> int:
    """How many asyncio StreamWriters to 127.0.0.1:``port`` are alive and not closed (found among live objects)."""
    return sum(
        1
        for o in gc.get_objects()
        if isinstance(o, asyncio.StreamWriter)
        and not o.transport.is_closing()
        and (o.get_extra_info("peername") or ("", 0))[1] == port
    )


def _resource_warnings() -> list[str]:
    """Collect garbage now and return the ResourceWarnings it raised (an unclosed socket/transport shows here)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gc.collect()
    return [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


class _BlackHole:
    """A listening socket that never answers: TCP connects (the kernel's backlog), AMQP never starts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0), backlog=16)
        self.port: int = self.sock.getsockname()[1]

    def closed_by_client(self, timeout: float = 2.0) -> list[bool]:
        """Accept every connection made so far and say, per connection, whether the client closed it (EOF)."""
        self.sock.settimeout(0.2)
        out: list[bool] = []
        while True:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                return out
            with conn:
                conn.settimeout(timeout)
                try:
                    while conn.recv(4096):
                        pass
                    out.append(True)
                except TimeoutError:
                    out.append(False)
                except ConnectionResetError:  # an aborted socket is closed too
                    out.append(True)

    def close(self) -> None:
        self.sock.close()


async def _reader_start(t: ServiceBusTransport) -> None:
    reader = t.reader("q")
    try:
        await reader.start()
    finally:
        await reader.stop()


class TestSockets:
    """Every socket the SDK opens for the transport is closed by the time the call returns (no garbage collector)."""

    @pytest.mark.parametrize(
        "call",
        [lambda t: t.open(), lambda t: t.check(), _reader_start],
        ids=["open", "check", "reader-start"],
    )
    async def test_black_hole_timeout_closes_the_socket(
        self, call: Callable[[ServiceBusTransport], Awaitable[object]]
    ) -> None:
        """A call that times out on a link that accepts and never answers raises RetryableError, and the
        connection it made is closed when it returns (the far end reads EOF), with nothing left for gc."""
        hole = _BlackHole()
        try:
            cfg = ServiceBusConfig(connection_string=connection_string(hole.port), queue="q", open_timeout=1.0)
            t = ServiceBusTransport(cfg)
            with pytest.raises(RetryableError, match=r"within open_timeout=1\.0s"):
                await call(t)
            await t.close()
            assert _open_writers(hole.port) == 0
            closed = hole.closed_by_client()
            assert closed and all(closed), f"connections left open by the SDK: {closed}"
        finally:
            hole.close()
        del t
        assert _resource_warnings() == []

    async def test_cancelled_open_closes_the_socket(self) -> None:
        """open() cancelled by its caller mid-handshake (well before open_timeout) re-raises CancelledError, and
        the connection it made is closed by then."""
        hole = _BlackHole()
        try:
            cfg = ServiceBusConfig(connection_string=connection_string(hole.port), queue="q", open_timeout=30)
            t = ServiceBusTransport(cfg)
            task = asyncio.create_task(t.open())
            await asyncio.sleep(0.5)  # connected; the SASL handshake waits for an answer that never comes
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert _open_writers(hole.port) == 0
            closed = hole.closed_by_client()
            assert closed and all(closed), f"connections left open by the SDK: {closed}"
        finally:
            hole.close()
        del t, task
        assert _resource_warnings() == []

    async def test_cut_mid_batch_then_close_leaves_no_socket(self, servicebus_env: ServiceBusEnv) -> None:
        """After a connection is cut halfway through a batch, the sender is dropped and close() returns with
        no socket of the transport still open (the SDK alone leaves the broken one to gc)."""
        peer = servicebus_env.require_peer("a TCP proxy in front of the broker")
        queue = await servicebus_env.provision(_name())
        proxy = TcpProxy("127.0.0.1", peer.port)
        await proxy.start()
        try:
            cfg = ServiceBusConfig(connection_string=connection_string(proxy.port), queue=queue, open_timeout=3)
            t = ServiceBusTransport(cfg)
            await t.open()

            def batch(n: int) -> list[Message]:
                kind = "application/octet-stream"
                return _msgs([Event(type="t", stream="k", data=b"x" * 512, content_type=kind) for _ in range(n)], queue)

            before = proxy.stats["bytes_up"]
            assert await t.send(batch(1)) == [Delivered()]
            proxy.cut_after(max(1, (proxy.stats["bytes_up"] - before) * 4))
            results = await t.send(batch(8))
            assert not proxy.armed and not all(isinstance(r, Delivered) for r in results)
            await t.close()
            assert _open_writers(proxy.port) == 0
        finally:
            await proxy.stop()
        del t
        assert _resource_warnings() == []


@pytest.mark.parametrize("kind", ["ServiceBusAuthenticationError", "ServiceBusAuthorizationError"])
def test_refused_credentials_stop_the_destination(kind: str) -> None:
    """Credentials refused (or without the Send claim) are never retried for ever: Rejected with
    disable_destination (events stay pending), and one PermanentError line from open/check."""
    import azure.servicebus.exceptions as sbe

    from outrelay.core.model.errors import PermanentError
    from outrelay.transports.servicebus._errors import ERRORS, result

    cfg = ServiceBusConfig(connection_string=connection_string(1), queue="q")
    r = result(getattr(sbe, kind)(message="Unauthorized access. 'Send' claim(s) are required"), cfg)
    assert isinstance(r, Rejected) and r.disable_destination and "Send claim" in r.reason
    with pytest.raises(PermanentError, match="Send claim") as raised, ERRORS.boundary("open", destination="sb"):
        raise getattr(sbe, kind)(message="refused")
    assert raised.value.__cause__ is None  # the SDK's text may quote the connection string
