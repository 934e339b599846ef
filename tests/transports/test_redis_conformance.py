"""The shared conformance suite against a real Redis server (127.0.0.1:6379 or OUTRELAY_REDIS_URL).

Every transport of the suite authenticates as an ACL user of its own, created
on the shared server for the run with a long random password (the ``secret``
the suite greps for) and deleted afterwards: ``outrelay-conf-<hex>`` may use
the conformance keys, ``outrelay-conf-<hex>-ro`` (same password) may do
everything there but write (``+@all -@write``) — the transport with
credentials that connect but may not publish, so ``check()`` must prove the
permission to publish, not only a connection.

The refused target (``refuse_target``) is a key under the conformance prefix
holding a string: ``XADD`` to it fails with ``WRONGTYPE``, per entry inside the
batch script, which the transport answers Rejected.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest
import redis.asyncio as aioredis

from outrelay.conformance import Binding, ConformanceSuite, ConformanceTarget
from outrelay.transports.redis._transport import RedisConfig, RedisTransport
from tests.peers.conformance_hooks import VIA_TIMEOUT, long_secret
from tests.services import free_port, need

KEYS = "outrelay-conf:"


class TestRedisConformance(ConformanceSuite):
    """Every check of the suite, one fresh stream key per check (deleted afterwards)."""

    @pytest.fixture
    async def conformance_target(self, redis_url: str) -> AsyncIterator[ConformanceTarget]:
        keys: list[str] = []
        secret, user = long_secret(), f"outrelay-conf-{uuid.uuid4().hex[:8]}"
        admin = aioredis.Redis.from_url(redis_url)
        try:
            await admin.execute_command("ACL", "SETUSER", user, "on", f">{secret}", f"~{KEYS}*", "+@all")
            # may do everything on the conformance keys but write: connect, INFO, read, run scripts (whose writes
            # Redis refuses) — so check() must prove it may *publish*, not only that it connects
            await admin.execute_command("ACL", "SETUSER", f"{user}-ro", "on", f">{secret}", f"~{KEYS}*", "+@all",
                                        "-@write")  # fmt: skip
        except aioredis.ResponseError as exc:
            await admin.aclose()
            need("Redis ACL SETUSER", f"the server at {redis_url} refused to create a test user: {exc}")

        async def provision(name: str) -> str:
            key = f"{KEYS}{uuid.uuid4().hex[:12]}"
            keys.append(key)
            return key

        async def refuse(key: str) -> str:
            wrong = f"{key}-wrongtype"
            keys.append(wrong)
            client = aioredis.Redis.from_url(redis_url)  # the check's own event loop: not `admin`'s
            try:
                await client.set(wrong, "not a stream")  # XADD to it: WRONGTYPE
            finally:
                await client.aclose()
            return wrong

        async def publish_foreign(key: str) -> None:
            client = aioredis.Redis.from_url(redis_url)  # the check's own event loop: not `admin`'s
            try:
                await client.xadd(key, {"hello": b"world"})  # no ce_* fields: not an outrelay CloudEvent
            finally:
                await client.aclose()

        def make(key: str, url: str, username: str = user, *, socket_timeout: float = 3.0) -> RedisTransport:
            cfg = RedisConfig(
                url=url,
                stream=key,
                username=username,
                password=secret,
                connect_timeout=1.0,
                socket_timeout=socket_timeout,
            )
            return RedisTransport(cfg, destination="conformance")

        parts = urlsplit(redis_url)
        yield ConformanceTarget(
            make_transport=lambda key: make(key, redis_url),
            provision=provision,
            make_unreachable=lambda key: make(key, f"redis://127.0.0.1:{free_port()}/0"),
            unsupported=RedisTransport.conformance_unsupported,  # declared once, on the class
            label="redis (real redis-server, ACL users of the run)",
            read_timeout=5.0,
            upstream=lambda key: (parts.hostname or "127.0.0.1", parts.port or 6379),
            # a black-holed or stalled command costs each fault check socket_timeout
            make_transport_via=lambda key, host, port: make(
                key, urlunsplit(parts._replace(netloc=f"{host}:{port}")), socket_timeout=VIA_TIMEOUT
            ),
            refuse_target=refuse,
            make_forbidden=lambda key: make(key, redis_url, username=f"{user}-ro"),
            secret=secret,
            binding=Binding("redis", prefix="ce_"),
            publish_foreign=publish_foreign,
            claim_timeout=2.0,
            late_reader=lambda t, key: t.reader(key, **(RedisTransport.conformance_late_reader_options or {})),
        )
        try:
            if keys:
                await admin.delete(*keys)
        finally:
            await admin.execute_command("ACL", "DELUSER", user, f"{user}-ro")
            await admin.aclose()
