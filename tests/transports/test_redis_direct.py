"""The redis transport's script calls on connections of its own (outrelay.transports.redis._direct), against a
real Redis: a private one (tests.peers.redis.OwnRedis) where a test flushes scripts or kills clients."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from outrelay import Event, Message
from outrelay.core.contract.transport import Delivered
from outrelay.transports.redis import _direct
from outrelay.transports.redis._direct import DirectScript
from outrelay.transports.redis._transport import RedisConfig, RedisTransport
from tests.peers.redis import OwnRedis, own_redis  # noqa: F401  (fixture)

# busy for ~0.2 s inside Redis, then answers ARGV[1]
SLOW_ECHO = """
local t = redis.call('TIME')
local start = t[1] * 1000000 + t[2]
repeat
  local n = redis.call('TIME')
until (n[1] * 1000000 + n[2]) - start > 200000
return ARGV[1]
"""


@pytest.fixture
async def admin(own_redis: OwnRedis) -> AsyncIterator[aioredis.Redis]:  # noqa: F811
    client = aioredis.Redis.from_url(own_redis.url)
    yield client
    await client.aclose()


def _transport(url: str) -> tuple[RedisTransport, str]:
    stream = f"direct-{uuid.uuid4().hex[:8]}"
    return RedisTransport(RedisConfig.model_validate({"url": url, "stream": stream}), destination="r"), stream


async def _send(t: RedisTransport, i: int) -> list[object]:
    ev = Event(type="t.x", stream="s", data={"i": i})
    return list(await t.send([Message(ev, t.target(ev), ev.stream)]))


async def test_flushed_scripts_are_loaded_again(own_redis: OwnRedis, admin: aioredis.Redis) -> None:  # noqa: F811
    """A NOSCRIPT reply (a restart or SCRIPT FLUSH) loads the script and sends again: no failed send."""
    t, stream = _transport(own_redis.url)
    await t.open()
    try:
        assert await _send(t, 0) == [Delivered()]
        await admin.script_flush()
        assert await _send(t, 1) == [Delivered()]
        assert await admin.xlen(stream) == 2
    finally:
        await t.close()


async def test_a_kept_connection_the_server_closed_is_replaced(
    own_redis: OwnRedis,  # noqa: F811
    admin: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A kept connection idle for over PROBE_AFTER is probed first: one the server closed meanwhile (CLIENT KILL)
    is replaced, and the send succeeds."""
    monkeypatch.setattr(_direct, "PROBE_AFTER", 0.0)
    t, stream = _transport(own_redis.url)
    await t.open()
    try:
        assert await _send(t, 0) == [Delivered()]
        killed = await admin.client_kill_filter(_type="normal", skipme=True)
        assert killed >= 1
        await asyncio.sleep(0.05)  # the FIN has arrived
        assert await _send(t, 1) == [Delivered()]
        assert await admin.xlen(stream) == 2
    finally:
        await t.close()


async def test_an_error_reply_keeps_the_connection_a_cancelled_call_drops_it(own_redis: OwnRedis) -> None:  # noqa: F811
    """An error reply leaves the connection in step (kept); a call cancelled before its reply leaves that reply
    unread, so its connection is dropped: the next call never reads the stale reply as its own."""
    client = aioredis.Redis.from_url(own_redis.url)
    try:
        failing = DirectScript(client, "return redis.error_reply('boom')")
        with pytest.raises(ResponseError, match="boom"):
            await failing(keys=[], args=[])
        assert len(failing._idle) == 1

        slow = DirectScript(client, SLOW_ECHO)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(slow(keys=[], args=["first"]), timeout=0.05)
        assert slow._idle == []
        assert await slow(keys=[], args=["second"]) == b"second"
        assert len(slow._idle) == 1
        await failing.close()
        await slow.close()
    finally:
        await client.aclose()
