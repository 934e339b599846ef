"""What a Redis group member makes of entries a foreign producer wrote: malformed CloudEvent
attributes come back as errors (for the dead-letter queue), well-formed ones as events."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from outrelay import Event
from outrelay.core.contract.subscription import Inbound, SubscriptionSpec
from outrelay.core.model import cloudevents
from outrelay.transports.redis import _gate
from outrelay.transports.redis._transport import RedisConfig, RedisTransport

GOOD = Event(type="order.created", stream="o-1", data=b"{}", content_type="application/json", tenant="acme")

# attribute -> a malformed value, and what the error must name
MALFORMED = [
    ("ce_time", "noon", "event time 'noon' is not RFC 3339"),
    ("ce_labels", "{not json", "attribute 'labels' is not JSON"),
    ("ce_sequence", "x", "attribute 'sequence' = 'x' is not an integer"),
    ("ce_type", "no spaces allowed", "event type 'no spaces allowed' is invalid"),
    ("ce_tenantid", "a\x1b[2Jb", "event tenant contains U+001B"),
    ("ce_id", b"\xff\xfe", "event id '\ufffd\ufffd' is invalid"),  # not UTF-8: replaced, then refused
]


@pytest.fixture
async def transport(redis_url: str) -> AsyncIterator[RedisTransport]:
    key = f"outrelay-test:decode:{uuid.uuid4().hex[:10]}"
    t = RedisTransport(RedisConfig(url=redis_url, stream=key), destination="r")
    await t.open()
    yield t
    await t.close()
    client = aioredis.Redis.from_url(redis_url)
    keys = [k async for k in client.scan_iter(match=key + "*", count=1000)]
    if keys:
        await client.delete(*keys)
    await client.aclose()


async def test_malformed_attributes_are_errors_and_good_events_decode(transport: RedisTransport) -> None:
    """Each malformed entry is an Inbound with the reason and its ordering key; good ones decode whole."""
    b = transport.subscription(SubscriptionSpec(target=transport.cfg.stream, group="g", member="m"))
    await b.start()
    fields: dict[str, str | bytes] = {**cloudevents.binary_headers(GOOD, "ce_"), "content-type": "application/json"}
    client = aioredis.Redis.from_url(transport.cfg.url)
    for name, value, _ in MALFORMED:
        await client.xadd(transport.cfg.stream, {**fields, name: value, "ce_streamid": f"bad-{name}", "data": b"{}"})
    await client.xadd(transport.cfg.stream, {**fields, "data": b"{}"})
    await client.aclose()
    got: list[Inbound] = []
    deadline = time.monotonic() + 10
    while len(got) < len(MALFORMED) + 1 and time.monotonic() < deadline:
        for m in await b.receive(10, 0.2):
            got.append(m)
            await m.ack()
    await b.stop()
    assert len(got) == len(MALFORMED) + 1
    for m, (name, _, reason) in zip(got, MALFORMED, strict=False):
        assert m.received is None and m.stream == f"bad-{name}"
        assert m.error is not None and reason in m.error and "\n" not in m.error
    last = got[-1].received
    assert last is not None and last.event == GOOD and last.event.time_text == GOOD.time_text
    assert last.headers["ce_tenantid"] == "acme" and "data" not in last.headers


def packed(*parts: object) -> bytes:
    """What the server's cjson makes of ``parts`` (strings: Latin-1 views of bytes): raw bytes from 0x80 up."""
    return json.dumps(list(parts), ensure_ascii=False).encode("latin-1")


class TestUnpackRead:
    """The packed reply of the gate's READ script (outrelay.transports.redis._gate.unpack_read)."""

    def test_fields_come_back_as_the_exact_bytes(self) -> None:
        """Entries (any bytes, invalid UTF-8 included) and list snapshots come back whole."""
        blob = bytes(range(256)) + "ü".encode()
        reply = packed(
            [["1-0", ["data", blob.decode("latin-1"), "\xff", ""]], ["2-0", ["h", "w"]]],
            ["k,ü".encode().decode("latin-1"), ""],
            ["k,ü".encode().decode("latin-1"), ["1-0", "0-9"]],
        )
        entries, lists, last = _gate.unpack_read([2, reply, b""])
        assert entries == [("1-0", {b"data": blob, b"\xff": b""}, "k,ü"), ("2-0", {b"h": b"w"}, "")]
        assert lists == {"k,ü": ["1-0", "0-9"]} and last == ""

    def test_no_list_touched_is_an_empty_table(self) -> None:
        """cjson writes an empty Lua table as {}: no snapshots."""
        reply = [1, json.dumps([[["1-0", ["a", "b"]]], [""], {}]).encode(), b""]
        assert _gate.unpack_read(reply) == ([("1-0", {b"a": b"b"}, "")], {}, "")

    def test_nothing_delivered_gives_the_last_id(self) -> None:
        """An empty read returns no entries and the stream's last id to wait from."""
        assert _gate.unpack_read([0, b"", b"5-1"]) == ([], {}, "5-1")

    @pytest.mark.parametrize(
        "body",
        [b"[[", b"{}", packed([["1-0", ["a", "b"]]], []), packed([["1-0", ["a"]]], [""], []), packed([], [], [])],
    )
    def test_a_reply_of_another_shape_is_an_error(self, body: bytes) -> None:
        """Not JSON, not three parts, entries and keys that do not match, an odd field list: ValueError."""
        with pytest.raises(ValueError):
            _gate.unpack_read([1, body, b""])
