"""The shared conformance suite against a real RabbitMQ broker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from urllib.parse import urlsplit, urlunsplit

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import AMQP
from outrelay.transports.rabbitmq._config import RabbitMQConfig, split_target
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
from tests.peers.rabbitmq import ExchangeFactory
from tests.services import free_port


def _netloc(url: str, host: str, port: int) -> str:
    """``url`` pointed at ``host:port``, credentials kept."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}" if auth else f"{host}:{port}"))


class TestRabbitMQConformance(ConformanceSuite):
    """Every check of the suite, one topic exchange of its own per check."""

    @pytest.fixture
    async def conformance_target(self, rabbitmq_url: str) -> AsyncIterator[ConformanceTarget]:
        exchanges = ExchangeFactory(rabbitmq_url)

        async def provision(name: str) -> str:
            return f"{await exchanges('conf')}/events.key"

        def make(target: str, url: str) -> RabbitMQTransport:
            exchange, routing_key = split_target(target)
            cfg = RabbitMQConfig(
                url=url, exchange=exchange, routing_key=routing_key, connect_timeout=2, confirm_timeout=5
            )
            return RabbitMQTransport(cfg, destination="conformance")

        parts = urlsplit(rabbitmq_url)
        yield ConformanceTarget(
            make_transport=lambda target: make(target, rabbitmq_url),
            provision=provision,
            make_unreachable=lambda target: make(target, f"amqp://guest:guest@127.0.0.1:{free_port()}/"),
            label="rabbitmq (real RabbitMQ 3.10 broker)",
            read_timeout=10.0,
            upstream=lambda target: (parts.hostname or "127.0.0.1", parts.port or 5672),
            make_transport_via=lambda target, host, port: make(target, _netloc(rabbitmq_url, host, port)),
            binding=AMQP,
        )
        await exchanges.delete_all()
