"""The shared conformance suite against the 6-node Redis Cluster (``cluster = true``), one fresh key per check.

The fault checks that need a proxy in front of the broker skip: a cluster client is redirected to
the nodes' own addresses (``CLUSTER SLOTS``), past any proxy. The kill/failover behaviour is
covered by ``test_redis_cluster.py``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import pytest
from redis.asyncio.cluster import RedisCluster

from outrelay.conformance import Binding, ConformanceSuite, ConformanceTarget
from outrelay.transports.redis._transport import RedisConfig, RedisTransport
from tests.cluster._redis_cluster import redis_cluster, redis_cluster_url
from tests.services import free_port

__all__ = ["redis_cluster", "redis_cluster_url"]  # fixtures used here


COVERED_STANDALONE = "covered by the standalone Redis target (same transport code; the test cluster has no ACL users)"


class TestRedisClusterConformance(ConformanceSuite):
    """Every check of the suite through redis-py's cluster client but the consumer side's."""

    @pytest.fixture(autouse=True)
    def _consumer_side_elsewhere(self, request: pytest.FixtureRequest) -> None:
        # they pass here as well; skipped to spare CI the time (the member-process checks cost seconds each)
        name = getattr(request.node, "originalname", request.node.name)
        if name.startswith("test_subscription_"):
            pytest.skip(
                "the consumer side is certified by the standalone Redis target (same backend code); "
                "a group on a cluster is test_redis_cluster.py's"
            )

    @pytest.fixture
    async def conformance_target(self, redis_cluster_url: str) -> AsyncIterator[ConformanceTarget]:
        keys: list[str] = []

        async def provision(name: str) -> str:
            key = f"outrelay-conf:{uuid.uuid4().hex[:12]}"
            keys.append(key)
            return key

        async def publish_foreign(key: str) -> None:
            client = RedisCluster.from_url(redis_cluster_url)
            try:
                await client.xadd(key, {"hello": b"world"})  # no ce_* fields: not an outrelay CloudEvent
            finally:
                await client.aclose()

        def make(key: str, url: str) -> RedisTransport:
            cfg = RedisConfig(url=url, stream=key, cluster=True, connect_timeout=1.0, socket_timeout=3.0)
            return RedisTransport(cfg, destination="conformance")

        yield ConformanceTarget(
            make_transport=lambda key: make(key, redis_cluster_url),
            provision=provision,
            make_unreachable=lambda key: make(key, f"redis://127.0.0.1:{free_port()}"),
            unsupported={
                "throttle": "Redis has no throttling answer (a full server refuses with OOM, no retry hint)",
                **dict.fromkeys(("secret", "make_forbidden", "refuse_target"), COVERED_STANDALONE),
            },
            label="redis cluster (6 real redis-server nodes, cluster = true)",
            read_timeout=5.0,
            binding=Binding("redis", prefix="ce_"),
            publish_foreign=publish_foreign,
            claim_timeout=2.0,
            late_reader=lambda t, key: t.reader(key, from_beginning=True),
            # no proxy can stay in front of a cluster (upstream), but an address that drops SYNs can
            make_transport_via=lambda key, host, port: make(key, f"redis://{host}:{port}"),
        )
        if keys:
            client = RedisCluster.from_url(redis_cluster_url)
            for key in keys:
                await client.delete(key)
            await client.aclose()
