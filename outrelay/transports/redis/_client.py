"""The client of the ``redis`` transport and its subscribers: standalone or Redis Cluster.

``cluster = false`` (default) gives redis-py's ``redis.asyncio.Redis``, one
node, no client-side retries (the relay retries). ``cluster = true`` gives
``redis.asyncio.cluster.RedisCluster`` seeded by ``url``: it discovers the
other nodes (``CLUSTER SLOTS``), sends each command to the primary of its
key's slot, follows ``MOVED`` (updating its slot map) and ``ASK`` (slot being
migrated), waits out ``TRYAGAIN``, and re-reads the topology after a
connection error or ``CLUSTERDOWN`` (up to :data:`CLUSTER_RETRIES` times
within one call; beyond that the relay retries).

:func:`open_client` connects and checks that the server is what the config
says: a cluster node under a standalone config, or a standalone server under
``cluster = true``, is a :class:`~outrelay.PermanentError` saying which
option to change (a standalone client would get ``MOVED`` for two thirds of
the keys; a cluster client cannot start on a standalone server).
"""

from __future__ import annotations

from typing import Any, TypeAlias

import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import RedisClusterException

from outrelay.kit import PermanentError
from outrelay.transports.redis._config import RedisConfig
from outrelay.transports.redis._errors import map_redis_errors

__all__ = ["CLUSTER_RETRIES", "Client", "connect", "open_client"]

Client: TypeAlias = aioredis.Redis | RedisCluster
#: re-reads of the cluster topology (and re-sends) within one call after a connection error or CLUSTERDOWN
CLUSTER_RETRIES = 3


def connect(cfg: RedisConfig) -> Client:
    """A client for ``cfg`` (not connected yet; see the module docstring for retries)."""
    kwargs: dict[str, Any] = {
        "username": cfg.username,
        "password": cfg.password.get_secret_value() if cfg.password else None,
        "socket_connect_timeout": cfg.connect_timeout,
        "socket_timeout": cfg.socket_timeout,
    }
    if cfg.tls:
        kwargs.update(
            ssl_ca_certs=cfg.ssl_ca_certs,
            ssl_certfile=cfg.ssl_certfile,
            ssl_keyfile=cfg.ssl_keyfile,
            ssl_check_hostname=cfg.ssl_check_hostname,
        )
    if cfg.cluster:
        # a short backoff: a failover or a slot move settles within a second or two
        retry = Retry(ExponentialBackoff(cap=0.5, base=0.05), CLUSTER_RETRIES)
        return RedisCluster.from_url(cfg.url, retry=retry, **kwargs)
    return aioredis.Redis.from_url(cfg.url, retry=Retry(NoBackoff(), 0), **kwargs)


async def open_client(cfg: RedisConfig, destination: str) -> tuple[Client, dict[str, Any]]:
    """A connected client and the ``INFO server`` of (one of) its node(s).

    :raises RetryableError: unreachable within ``connect_timeout``.
    :raises PermanentError: authentication failed, or the server's mode is not the configured one.
    """
    client = connect(cfg)
    try:
        with map_redis_errors(f"connect to {cfg.url}", destination):
            try:
                if isinstance(client, RedisCluster):
                    await client.initialize()
                info: dict[str, Any] = await client.info("server")
            except RedisClusterException as exc:
                if "not enabled" in str(exc):
                    raise PermanentError(
                        f"redis {cfg.url} is a standalone server (cluster mode disabled) but the "
                        "config says `cluster = true`: remove `cluster = true`, or point url at a node of the cluster",
                        destination=destination,
                    ) from None
                raise
        if not isinstance(client, RedisCluster) and info.get("redis_mode") == "cluster":
            raise PermanentError(
                f"redis {cfg.url} is a Redis Cluster node but the config lacks `cluster = true`: "
                "set `cluster = true` (a single-node client gets MOVED for the keys of other nodes' slots)",
                destination=destination,
            )
    except BaseException:
        await client.aclose()
        raise
    return client, info
