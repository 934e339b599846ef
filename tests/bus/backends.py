"""The backends the shared subscriber suite runs against, one entry each.

A backend gives the destination options the relay publishes with (and the
bus consumes), and a way to put a foreign (non-CloudEvent) message on the
target. ``processes`` says whether members run as separate processes (every
real broker) or as tasks in the test process (the in-process bus).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.services import need

__all__ = ["BACKENDS", "BusBackend", "make_backend"]

BACKENDS = ("memory", "redis", "nats", "kafka", "rabbitmq")


@dataclasses.dataclass
class BusBackend:
    name: str
    options: dict[str, Any]
    foreign: Callable[[], Awaitable[None]]
    processes: bool = True


def _tag() -> str:
    return uuid.uuid4().hex[:10]


async def make_backend(name: str, request: pytest.FixtureRequest) -> BusBackend:
    """Build the backend ``name`` on its real peer (skips/fails via the peers' fixtures when absent)."""
    if name == "memory":
        from outrelay.transports.memory import MemoryTransport

        broker = f"bus-{_tag()}"

        async def foreign_memory() -> None:
            MemoryTransport.broker(broker).put_foreign("order.created", b"not a cloudevent", key="s0")

        return BusBackend(name, {"transport": "memory", "broker": broker}, foreign_memory, processes=False)

    if name == "redis":
        url = request.getfixturevalue("redis_url")
        key = f"outrelay:bus-test:{_tag()}"

        async def foreign_redis() -> None:
            import redis.asyncio as aioredis

            client = aioredis.from_url(url)
            try:
                await client.xadd(key, {"hello": b"world"})
            finally:
                await client.aclose()

        return BusBackend(name, {"transport": "redis", "url": url, "stream": key}, foreign_redis)

    if name == "nats":
        url = request.getfixturevalue("nats_url")
        tag = _tag()
        stream, subject = f"OR_BUS_{tag}".upper(), f"or.bus.{tag}"

        async def foreign_nats() -> None:
            import nats

            nc = await nats.connect(url)
            try:
                await nc.jetstream().publish(f"{subject}.order.created", b"not a cloudevent")
            finally:
                await nc.close()

        opts = {
            "transport": "nats",
            "servers": [url],
            "subject": subject + ".{type}",
            "create_stream": {"name": stream, "subjects": [f"{subject}.>"], "storage": "memory"},
            "group_shards": 4,  # share the work between members (the default, 1, keeps one active member)
        }
        return BusBackend(name, opts, foreign_nats)

    if name == "kafka":
        from tests.peers.kafka import new_topic

        peer = request.getfixturevalue("kafka_peer")
        topic = await new_topic(peer, "bus", partitions=6)

        async def foreign_kafka() -> None:
            from aiokafka import AIOKafkaProducer

            p = AIOKafkaProducer(bootstrap_servers=peer.bootstrap)
            await p.start()
            try:
                await p.send_and_wait(topic, b"not a cloudevent", key=b"s0")
            finally:
                await p.stop()

        return BusBackend(name, {"transport": "kafka", **peer.options(topic)}, foreign_kafka)

    if name == "rabbitmq":
        url = request.getfixturevalue("rabbitmq_url")
        exchange = f"or-bus-{_tag()}"

        async def foreign_rabbitmq() -> None:
            import aio_pika

            conn = await aio_pika.connect(url)
            async with conn:
                ch = await conn.channel()
                ex = await ch.get_exchange(exchange)
                await ex.publish(aio_pika.Message(b"not a cloudevent"), routing_key="order.created")

        opts = {"transport": "rabbitmq", "url": url, "exchange": exchange, "declare_exchange": True}
        return BusBackend(name, opts, foreign_rabbitmq)

    need(name, "no such bus backend in tests/bus/backends.py")
