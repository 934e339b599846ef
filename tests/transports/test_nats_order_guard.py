"""The nats transport's order guard (``order_guard``, ``_chain.py``) against a real JetStream server.

The server refusing message *k* while accepting *k+1* already on the wire is
what breaks a pipelined stream's order; a leader change does it at random,
a stream's ``max_msg_size`` does it every time — so these tests use that.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import nats
import nats.js.api
import pytest

from outrelay import Delivered, Event, Message, Rejected, RetryLater
from outrelay.transports.nats._chain import Chain, server_last_id
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._transport import NatsTransport
from tests.peers.nats import one_stream


def _stream(url: str, **config: Any) -> contextlib.AbstractAsyncContextManager[tuple[str, str]]:
    return one_stream(url, "guard", **config)


async def _stored(url: str, name: str) -> list[str]:
    """The event id (``ce-id``) of every message in stream ``name``, in stream order (the Nats-Msg-Id of a
    re-sent refused message is ``<event id>.r<n>``)."""
    nc = await nats.connect(url, connect_timeout=2, allow_reconnect=False, max_reconnect_attempts=1)
    try:
        js = nc.jetstream()
        info = await js.stream_info(name)
        out = []
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            if info.state.messages == 0:
                break
            msg = await js.get_msg(name, seq)
            out.append((msg.headers or {}).get("ce-id", ""))
        return out
    finally:
        await nc.close()


def _batch(t: NatsTransport) -> tuple[list[Event], list[Message]]:
    big = Event(type="t", stream="a", data=b"x" * 600)  # over the stream's max_msg_size, under ours
    events = [big, Event(type="t", stream="a", data=b"a2"), Event(type="t", stream="b", data=b"b1")]
    return events, [Message(e, t.target(e), e.stream) for e in events]


async def test_guard_stores_nothing_past_a_refused_message(nats_url: str) -> None:
    """Pipelined, guarded: the server refuses a1 (too large), so a2 and b1 behind it on the wire are
    refused too (RetryLater), nothing is stored; the retry goes through, in order, chain resynced."""
    async with _stream(nats_url, max_msg_size=512, storage=nats.js.api.StorageType.MEMORY) as (name, prefix):
        cfg = NatsConfig(
            servers=(nats_url,), subject=prefix + ".{stream}", expected_stream=name, order_guard="last-msg-id"
        )
        t = NatsTransport(cfg)
        await t.open()
        try:
            events, batch = _batch(t)
            r1, r2, r3 = await t.send(batch)
            assert isinstance(r1, Rejected) and "max_msg_size" in r1.reason
            assert isinstance(r2, RetryLater) and isinstance(r3, RetryLater)
            assert "order guard" in r3.error
            assert await _stored(nats_url, name) == []
            assert await t.send(batch[1:]) == [Delivered(), Delivered()]
            assert await _stored(nats_url, name) == [events[1].id, events[2].id]
        finally:
            await t.close()


async def test_without_guard_a_later_message_is_stored_past_the_hole(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same batch with order_guard = "off": a2 is stored although a1 was not (the case the guard
    closes), and the relay's warning names it."""
    async with _stream(nats_url, max_msg_size=512, storage=nats.js.api.StorageType.MEMORY) as (name, prefix):
        t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{stream}", order_guard="off"))
        await t.open()
        try:
            events, batch = _batch(t)
            with caplog.at_level(logging.WARNING, logger="outrelay.transports.nats"):
                r1, r2, r3 = await t.send(batch)
            assert isinstance(r1, Rejected) and r2 == Delivered() and r3 == Delivered()
            assert any("may be out of order" in r.getMessage() for r in caplog.records)
            assert await _stored(nats_url, name) == [events[1].id, events[2].id]
        finally:
            await t.close()


@pytest.mark.parametrize(
    ("stream_config", "pipeline", "guarded"),
    [
        ({}, True, False),  # R1, discard old: nothing to guard against, no header
        ({"discard": nats.js.api.DiscardPolicy.NEW, "max_msgs": 1000}, True, True),
        ({"discard": nats.js.api.DiscardPolicy.NEW, "max_msgs": 1000}, False, False),
    ],
    ids=["r1-discard-old", "discard-new", "discard-new-unpipelined"],
)
async def test_auto_guards_only_where_needed(
    nats_url: str, stream_config: dict[str, Any], pipeline: bool, guarded: bool
) -> None:
    """order_guard = "auto" chains messages only when pipelining into a stream that can refuse k and
    take k+1 (replicated, or discard = new); the headers show it."""
    async with _stream(nats_url, storage=nats.js.api.StorageType.MEMORY, **stream_config) as (name, prefix):
        t = NatsTransport(
            NatsConfig(
                servers=(nats_url,),
                subject=prefix + ".{stream}",
                expected_stream=name,
                pipeline=pipeline,
                order_guard="auto",
            )
        )
        await t.open()
        try:
            events = [Event(type="t", stream="s", data=b"1"), Event(type="t", stream="s", data=b"2")]
            assert await t.send([Message(e, t.target(e), e.stream) for e in events]) == [Delivered()] * 2
        finally:
            await t.close()
        nc = await nats.connect(nats_url)
        try:
            second = await nc.jetstream().get_msg(name, 2)
        finally:
            await nc.close()
        expected = (second.headers or {}).get("Nats-Expected-Last-Msg-Id")
        assert expected == (events[0].id if guarded else None)


def test_explicit_guard_needs_the_stream() -> None:
    """order_guard = "last-msg-id" without expected_stream/create_stream is a config error saying what to set."""
    with pytest.raises(ValueError, match="set expected_stream"):
        NatsConfig(order_guard="last-msg-id")


def test_chain_links_and_resyncs() -> None:
    """Links name their predecessor; a refusal restarts the chain once per generation."""
    chain = Chain("S")
    assert chain.link("a") == (None, 0)
    assert chain.link("b") == ("a", 0)
    assert chain.broken(0, "a") and chain.last == "a" and chain.generation == 1
    assert not chain.broken(0, "zzz")  # a late refusal of the old generation changes nothing
    assert chain.link("c") == ("a", 1)
    chain.unlink("c", "a", 1)
    assert chain.last == "a"
    assert server_last_id("wrong last msg ID: 42ab") == "42ab"
    assert server_last_id("wrong last msg ID: ") == ""
    assert server_last_id("wrong last sequence: 3") is None


def test_a_duplicate_ack_without_a_sequence_is_retried_under_a_new_message_id() -> None:
    """nats-server 2.9 in a cluster stages a message id when the leader proposes the message and keeps it when
    the message is refused at apply time; a re-send is then acked "duplicate" with seq 0 although nothing was
    stored. That ack is RetryLater, and the next attempt goes out under a new Nats-Msg-Id; a real duplicate
    (seq > 0) is Delivered and the event's own id comes back."""
    t = NatsTransport(NatsConfig(subject="ev.{stream}"))
    ev = Event(type="t", stream="s")
    m = Message(ev, t.target(ev), ev.stream)
    first = t._prepare(m)
    assert isinstance(first, dict) and first["Nats-Msg-Id"] == ev.id
    assert isinstance(t._acked(m, {"stream": "S", "seq": 0, "duplicate": True}), RetryLater)
    again = t._prepare(m)
    assert isinstance(again, dict) and again["Nats-Msg-Id"] == f"{ev.id}.r1"
    assert t._acked(m, {"stream": "S", "seq": 7, "duplicate": True}) == Delivered(duplicate=True)
    after = t._prepare(m)
    assert isinstance(after, dict) and after["Nats-Msg-Id"] == ev.id


def test_a_refused_publish_is_resent_under_a_new_message_id() -> None:
    """A JetStream refusal (here: the order guard's wrong last message id) leaves the message id staged on a
    clustered stream, so the re-send uses a new one."""
    t = NatsTransport(NatsConfig(subject="ev.{stream}"))
    ev = Event(type="t", stream="s")
    m = Message(ev, t.target(ev), ev.stream)
    refused = nats.js.errors.APIError(code=400, err_code=10070, description="wrong last msg ID: x")
    assert isinstance(t._failed(m, refused), RetryLater)
    again = t._prepare(m)
    assert isinstance(again, dict) and again["Nats-Msg-Id"] == f"{ev.id}.r1"
    assert isinstance(t._failed(m, TimeoutError()), RetryLater)  # unknown outcome: keep the id
    assert t._prepare(m) == again
