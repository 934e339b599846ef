"""The shared conformance suite against a real Redis server (127.0.0.1:6379 or OUTRELAY_REDIS_URL)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis

from outrelay.conformance import Binding, ConformanceSuite, ConformanceTarget
from outrelay.transports.redis._transport import RedisConfig, RedisTransport
from tests.services import free_port


class TestRedisConformance(ConformanceSuite):
    """Every check of the suite, one fresh stream key per check (deleted afterwards)."""

    @pytest.fixture
    async def conformance_target(self, redis_url: str) -> AsyncIterator[ConformanceTarget]:
        keys: list[str] = []

        async def provision(name: str) -> str:
            key = f"outrelay-conf:{uuid.uuid4().hex[:12]}"
            keys.append(key)
            return key

        def make(key: str, url: str) -> RedisTransport:
            cfg = RedisConfig(url=url, stream=key, connect_timeout=1.0, socket_timeout=3.0)
            return RedisTransport(cfg, destination="conformance")

        parts = urlsplit(redis_url)
        yield ConformanceTarget(
            make_transport=lambda key: make(key, redis_url),
            provision=provision,
            make_unreachable=lambda key: make(key, f"redis://127.0.0.1:{free_port()}/0"),
            label="redis (real redis-server)",
            read_timeout=5.0,
            upstream=lambda key: (parts.hostname or "127.0.0.1", parts.port or 6379),
            make_transport_via=lambda key, host, port: make(key, urlunsplit(parts._replace(netloc=f"{host}:{port}"))),
            binding=Binding("redis", prefix="ce_"),
        )
        if keys:
            client = aioredis.Redis.from_url(redis_url)
            await client.delete(*keys)
            await client.aclose()
