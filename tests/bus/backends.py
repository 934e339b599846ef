"""The backends the shared subscriber suite runs against, one entry each.

A backend gives the destination options the relay publishes with (and the
bus consumes). ``processes`` says whether members run as separate processes
(every real broker) or as tasks in the test process (the in-process bus).
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.services import need

__all__ = ["BACKENDS", "GROUPS", "BusBackend", "make_backend"]

BACKENDS = ("memory", "redis", "nats", "kafka", "rabbitmq")
#: every consumer group the bus tests subscribe with: :attr:`BusBackend.cleanup` deletes their broker state
GROUPS = ("billing", "strict", "g")


@dataclasses.dataclass
class BusBackend:
    name: str
    options: dict[str, Any]
    processes: bool = True
    #: deletes what the backend and its consumer groups (:data:`GROUPS`) left on the broker
    cleanup: Callable[[], Awaitable[None]] | None = None


def _tag() -> str:
    return uuid.uuid4().hex[:10]


async def make_backend(name: str, request: pytest.FixtureRequest) -> BusBackend:
    """Build the backend ``name`` on its real peer (skips/fails via the peers' fixtures when absent)."""
    if name == "memory":
        return BusBackend(name, {"transport": "memory", "broker": f"bus-{_tag()}"}, processes=False)

    if name == "redis":
        url = request.getfixturevalue("redis_url")
        key = f"outrelay:bus-test:{_tag()}"
        options = {"transport": "redis", "url": url, "stream": key}
        return BusBackend(name, options, cleanup=lambda: _redis_cleanup(url, key))

    if name == "nats":
        url = request.getfixturevalue("nats_url")
        tag = _tag()
        stream, subject = f"OR_BUS_{tag}".upper(), f"or.bus.{tag}"
        opts = {
            "transport": "nats",
            "servers": [url],
            "subject": subject + ".{type}",
            "create_stream": {"name": stream, "subjects": [f"{subject}.>"], "storage": "memory"},
            "group_shards": 4,  # share the work between members (the default, 1, keeps one active member)
        }
        return BusBackend(name, opts)

    if name == "kafka":
        from tests.peers.kafka import new_topic

        peer = request.getfixturevalue("kafka_peer")
        topic = await new_topic(peer, "bus", partitions=6)
        return BusBackend(name, {"transport": "kafka", **peer.options(topic)})

    if name == "rabbitmq":
        url = request.getfixturevalue("rabbitmq_url")
        exchange = f"or-bus-{_tag()}"
        opts = {"transport": "rabbitmq", "url": url, "exchange": exchange, "declare_exchange": True}
        return BusBackend(name, opts, cleanup=lambda: _rabbitmq_cleanup(url, exchange))

    need(name, "no such bus backend in tests/bus/backends.py")


async def _redis_cleanup(url: str, key: str) -> None:
    """Delete the stream and every gate list of its groups (``<key>:gate:...``)."""
    import redis.asyncio as aioredis

    client = aioredis.Redis.from_url(url)
    try:
        doomed = [key] + [k async for k in client.scan_iter(match=f"{key}:gate:*", count=1000)]
        await client.delete(*doomed)
    finally:
        await client.aclose()


async def _rabbitmq_cleanup(url: str, exchange: str) -> None:
    """Delete the exchange and each group's queues, shards and hash exchange (AMQP lists nothing, so by
    name: deleting what does not exist is a no-op on RabbitMQ)."""
    import aio_pika
    import aiormq.exceptions

    from outrelay.transports.rabbitmq._subscriber import group_queue

    conn = await aio_pika.connect(url, timeout=5)
    async with conn:
        channel = await conn.channel()

        async def delete(what: str, name: str) -> None:
            nonlocal channel
            if channel.is_closed:  # an error reply closes the channel
                channel = await conn.channel()
            with contextlib.suppress(aiormq.exceptions.AMQPError, RuntimeError):
                await (channel.queue_delete(name) if what == "queue" else channel.exchange_delete(name))

        for group in GROUPS:
            base = group_queue(group, exchange)
            for queue in (base, f"{base}.members", *(f"{base}.{i}" for i in range(64))):
                await delete("queue", queue)
            await delete("exchange", base)
        await delete("exchange", exchange)
