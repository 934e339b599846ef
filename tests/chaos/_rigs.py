"""One :class:`Rig` fixture per destination: the broker, a fault proxy in front of it, a reader.

Kafka (a private tansu advertising the proxy, storing on the session's moto
S3 so a kill -9 keeps the log), NATS JetStream (a private ``nats-server -js``,
file storage) and Redis (a private ``redis-server``, AOF ``always``) can be
killed and restarted on the same port. Webhooks go to a receiver process of
our own (``_sink.py``), killed the same way. RabbitMQ runs the shared broker
(a private one takes ~10 s and a few hundred MB to start): proxy faults only.
Readers connect to the broker directly (Kafka through the healed proxy, the
address tansu advertises) after the run and return every copy stored. Kill
tests bypass the proxy (``Rig.direct``) except for Kafka, whose clients
always follow the advertised address: the proxy.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis.asyncio as aioredis

from outrelay.core.contract.transport import Reader
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._transport import NatsTransport
from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
from outrelay.transports.redis._reader import decode as redis_decode
from tests.chaos._harness import Rig
from tests.chaos._peers import OwnProcess, sink_records, tansu, webhook_sink
from tests.peers.kafka import KafkaPeer, new_topic
from tests.peers.nats import private_nats_server
from tests.peers.proxy import TcpProxy
from tests.peers.rabbitmq import ExchangeFactory
from tests.peers.redis import OwnRedis
from tests.services import need

__all__ = ["kafka_rig", "nats_rig", "rabbitmq_rig", "redis_rig", "webhook_rig"]

Restart = Callable[[], None]


def restarter(kill: Restart, start: Restart) -> Callable[[float], Awaitable[None]]:
    """``kill_restart(down)``: kill now, start again (off the event loop: it waits for the port) after ``down`` s."""

    async def kill_restart(down: float) -> None:
        kill()
        await asyncio.sleep(down)
        await asyncio.to_thread(start)

    return kill_restart


async def read_all(reader: Reader, count: int, quiet: float = 0.5, limit: float = 30.0) -> list[tuple[str, str]]:
    """Every copy ``reader`` yields until it has ``count`` distinct events and then stays quiet ``quiet`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit
    got: list[tuple[str, str]] = []
    distinct: set[str] = set()
    async with reader:
        while loop.time() < deadline:
            batch = await reader.read(5000, quiet if len(distinct) >= count else min(2.0, deadline - loop.time()))
            got += [(r.event.id, r.event.stream) for r in batch]
            distinct.update(r.event.id for r in batch)
            if not batch and len(distinct) >= count:
                break
    return got


@pytest.fixture
async def proxy_to() -> AsyncIterator[Callable[[int], Awaitable[TcpProxy]]]:
    """``await proxy_to(port)``: a started fault proxy to 127.0.0.1:port, stopped after the test."""
    made: list[TcpProxy] = []

    async def make(port: int) -> TcpProxy:
        proxy = TcpProxy("127.0.0.1", port)
        await proxy.start()
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        await proxy.stop()


@pytest.fixture
async def nats_rig(tmp_path: Path, proxy_to: Callable[[int], Awaitable[TcpProxy]]) -> AsyncIterator[Rig]:
    """Relay → proxy → a private nats-server -js (file storage)."""
    with private_nats_server(tmp_path) as server:
        proxy = await proxy_to(server.port)
        options = {
            "transport": "nats",
            "servers": [f"nats://127.0.0.1:{proxy.port}"],
            "subject": "chaos.{stream}",
            "create_stream": {"name": "CHAOS", "subjects": ["chaos.>"], "storage": "file"},
            "ack_timeout": 10.0,
            "connect_timeout": 1.0,
            "reconnect_time_wait": 0.05,
        }

        async def read_back(count: int) -> list[tuple[str, str]]:
            reader = NatsTransport(NatsConfig(servers=(server.url,))).reader("chaos.>", stream="CHAOS", deliver="all")
            return await read_all(reader, count)

        direct = {"servers": [server.url]}
        yield Rig("nats", options, proxy, read_back, restarter(server.kill, server.start), direct)


@pytest.fixture
async def redis_rig(tmp_path: Path, proxy_to: Callable[[int], Awaitable[TcpProxy]]) -> AsyncIterator[Rig]:
    """Relay → proxy → a private redis-server (AOF, fsync always)."""
    if shutil.which("redis-server") is None:
        need("redis-server", "the binary is not on PATH (apt-get install redis-server)")
    server = OwnRedis(tmp_path / "redis")
    server.dir.mkdir()
    server.start()
    try:
        proxy = await proxy_to(server.port)
        options = {
            "transport": "redis",
            "url": f"redis://127.0.0.1:{proxy.port}/0",
            "stream": "chaos",
            "connect_timeout": 0.5,
            "socket_timeout": 10.0,
        }

        async def read_back(count: int) -> list[tuple[str, str]]:
            client = aioredis.Redis.from_url(server.url)
            try:
                entries = await client.xrange("chaos")
            finally:
                await client.aclose()
            decoded = (redis_decode("chaos", fields or {}) for _, fields in entries or [])
            return [(r.event.id, r.event.stream) for r in decoded]

        yield Rig("redis", options, proxy, read_back, restarter(server.kill, server.start), {"url": server.url})
    finally:
        server.kill()


@pytest.fixture
async def kafka_rig(moto_endpoint: str, proxy_to: Callable[[int], Awaitable[TcpProxy]]) -> AsyncIterator[Rig]:
    """Relay → proxy → a private tansu (S3 storage on moto, so a kill -9 keeps the log), advertising the proxy."""
    proxy = await proxy_to(0)  # the upstream port is known once tansu's port is picked
    broker = tansu(proxy.port, s3_endpoint=moto_endpoint)
    proxy.upstream = ("127.0.0.1", broker.port)
    await asyncio.to_thread(broker.start)
    try:
        peer = KafkaPeer(f"127.0.0.1:{proxy.port}", tansu=True)
        topic = await new_topic(peer, prefix="chaos", partitions=4)
        options: dict[str, Any] = {
            "transport": "kafka",
            **peer.options(topic, connect_timeout=2.0, request_timeout=5.0),
        }

        async def read_back(count: int) -> list[tuple[str, str]]:
            cfg = KafkaConfig.model_validate({k: v for k, v in options.items() if k != "transport"})
            return await read_all(KafkaTransport(cfg).reader(topic, from_beginning=True), count)

        yield Rig("kafka", options, proxy, read_back, restarter(broker.kill, broker.start))
    finally:
        broker.kill()


@pytest.fixture
async def rabbitmq_rig(
    rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory, proxy_to: Callable[[int], Awaitable[TcpProxy]]
) -> AsyncIterator[Rig]:
    """Relay → proxy → the shared RabbitMQ, into a durable queue bound before the run (no kill: see the module)."""
    exchange = await rabbitmq_exchanges("chaos")
    queue = await rabbitmq_exchanges.queue(exchange, "s.*")
    parts = urlsplit(rabbitmq_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 5672)
    await proxy.start()
    try:
        url = rabbitmq_url.replace(f"{parts.hostname}:{parts.port or 5672}", f"127.0.0.1:{proxy.port}")
        options = {
            "transport": "rabbitmq",
            "url": url,
            "exchange": exchange,
            "routing_key": "s.{stream}",
            "confirm_timeout": 10.0,
            "connect_timeout": 1.0,
        }

        async def read_back(count: int) -> list[tuple[str, str]]:
            cfg = RabbitMQConfig(url=rabbitmq_url, exchange=exchange)
            return await read_all(RabbitMQTransport(cfg).reader(f"{exchange}/s.*", queue=queue), count)

        yield Rig("rabbitmq", options, proxy, read_back)
    finally:
        await proxy.stop()


@pytest.fixture
async def webhook_rig(tmp_path: Path, proxy_to: Callable[[int], Awaitable[TcpProxy]]) -> AsyncIterator[Rig]:
    """Relay → proxy → a webhook receiver process of our own (``_sink.py``) recording what it acknowledged."""
    records = tmp_path / f"sink-{uuid.uuid4().hex[:6]}.tsv"
    sink: OwnProcess = webhook_sink(records)
    await asyncio.to_thread(sink.start)
    try:
        proxy = await proxy_to(sink.port)
        options = {
            "transport": "webhook",
            "url": f"http://127.0.0.1:{proxy.port}/hook",
            "allow_private_network": True,
            "timeout": 2.0,  # per request, under attempt_timeout: see the report on partial batches
        }

        async def read_back(count: int) -> list[tuple[str, str]]:
            return sink_records(records)

        direct = {"url": f"http://127.0.0.1:{sink.port}/hook"}
        yield Rig("webhook", options, proxy, read_back, restarter(sink.kill, sink.start), direct)
    finally:
        sink.kill()
