"""RabbitMQ peer: the shared broker, with exchanges made and removed per test.

``OUTRELAY_RABBITMQ_URL`` points the tests at another broker (default
``amqp://guest:guest@127.0.0.1:5672/``). Every test declares uniquely named
exchanges (and queues) and deletes them afterwards.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aio_pika
import aiormq.exceptions
import pytest

from tests.services import need, port_open

__all__ = ["ExchangeFactory", "rabbitmq_exchanges", "rabbitmq_url"]


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    """The broker under test; skips (fails in CI) when it is unreachable."""
    url = os.environ.get("OUTRELAY_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    parts = urlsplit(url)
    if not port_open(parts.hostname or "127.0.0.1", parts.port or 5672):
        need(
            "RabbitMQ",
            f"nothing listens at {parts.hostname}:{parts.port}; start rabbitmq-server or set OUTRELAY_RABBITMQ_URL",
        )
    return url


class ExchangeFactory:
    """Declares unique exchanges/queues on one broker and deletes them at teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.exchanges: list[str] = []
        self.queues: list[str] = []

    async def __call__(self, prefix: str = "t", type: str = "topic") -> str:
        """Declare a fresh (non-durable) exchange and return its name."""
        name = f"or-{prefix}-{uuid.uuid4().hex[:10]}"
        conn = await aio_pika.connect(self.url, timeout=5)
        async with conn:
            channel = await conn.channel()
            await channel.declare_exchange(name, type)
        self.exchanges.append(name)
        return name

    async def queue(self, exchange: str, routing_key: str, arguments: dict[str, Any] | None = None) -> str:
        """Declare a queue bound to ``exchange`` (deleted at teardown); return its name."""
        name = f"or-q-{uuid.uuid4().hex[:10]}"
        conn = await aio_pika.connect(self.url, timeout=5)
        async with conn:
            channel = await conn.channel()
            queue = await channel.declare_queue(name, durable=True, arguments=arguments)
            await queue.bind(exchange, routing_key)
        self.queues.append(name)
        return name

    async def delete_all(self) -> None:
        if not (self.exchanges or self.queues):
            return
        conn = await aio_pika.connect(self.url, timeout=5)
        async with conn:
            for q in self.queues:
                channel = await conn.channel()
                with contextlib.suppress(aiormq.exceptions.AMQPError):
                    await channel.queue_delete(q)
            for name in self.exchanges:
                channel = await conn.channel()
                with contextlib.suppress(aiormq.exceptions.AMQPError):
                    await channel.exchange_delete(name)


@pytest.fixture
async def rabbitmq_exchanges(rabbitmq_url: str) -> AsyncIterator[ExchangeFactory]:
    """``await rabbitmq_exchanges("prefix")`` makes a fresh exchange, deleted after the test."""
    factory = ExchangeFactory(rabbitmq_url)
    yield factory
    await factory.delete_all()
