"""The shared conformance suite against a real RabbitMQ broker.

When ``rabbitmqctl`` can manage the broker (the local one), every transport of
the suite logs in as a user created for this module with a long random
password (the ``secret`` the suite greps for): ``outrelay-conf-<hex>`` with
full permissions on vhost ``/``, and ``outrelay-conf-<hex>-ro`` (same password)
with configure and read permissions but no write (it connects, declares and
reads, but may not publish: ``make_forbidden``, so ``check()`` must prove the
permission to publish). Both are deleted afterwards. Otherwise the suite runs as the URL's user and the
secret/forbidden checks skip naming the hook.

The refused target (``refuse_target``) is a routing key of the check's own
exchange that no queue binds (the reader binds ``events.key`` only): with
``mandatory`` and ``unroutable = "permanent"`` (the transport's defaults) the
broker returns each such message and the transport answers Rejected.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from urllib.parse import urlsplit, urlunsplit

import aio_pika
import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import AMQP
from outrelay.transports.rabbitmq._config import RabbitMQConfig, split_target
from outrelay.transports.rabbitmq._subscriber import group_queue
from outrelay.transports.rabbitmq._transport import RabbitMQTransport
from tests.peers.conformance_hooks import VIA_TIMEOUT, long_secret, rabbitmq_users
from tests.peers.rabbitmq import ExchangeFactory
from tests.services import free_port

SHARDS = 16  # group_shards, the default: a group's shard queues (deleted at teardown)


def _netloc(url: str, host: str, port: int) -> str:
    """``url`` pointed at ``host:port``, credentials kept."""
    parts = urlsplit(url)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}" if auth else f"{host}:{port}"))


@pytest.fixture(scope="module")
def rabbitmq_login() -> Iterator[tuple[str, str] | None]:
    """``(user, password)`` of the module's full-permission user (``user + "-ro"``: no permissions), or None."""
    if os.environ.get("OUTRELAY_RABBITMQ_URL"):  # rabbitmqctl reaches the local node, not that broker
        yield None
        return
    user, password = f"outrelay-conf-{uuid.uuid4().hex[:8]}", long_secret()
    users = rabbitmq_users(password, {user: ".*", f"{user}-ro": (".*", "", ".*")})  # -ro: configure and read
    problem = next(users)
    yield None if problem else (user, password)
    next(users, None)


def _login(url: str, user: str) -> str:
    """``url`` with ``user`` as its user and no password (the password goes in the config's SecretStr)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{user}@{parts.netloc.rpartition('@')[2]}"))


class TestRabbitMQConformance(ConformanceSuite):
    """Every check of the suite, one topic exchange of its own per check."""

    @pytest.fixture
    async def conformance_target(
        self, rabbitmq_url: str, rabbitmq_login: tuple[str, str] | None
    ) -> AsyncIterator[ConformanceTarget]:
        exchanges = ExchangeFactory(rabbitmq_url)
        user, secret = rabbitmq_login or ("", None)
        url = _login(rabbitmq_url, user) if user else rabbitmq_url

        async def provision(name: str) -> str:
            return f"{await exchanges('conf')}/events.key"

        async def refuse(target: str) -> str:
            exchange, _ = split_target(target)
            return f"{exchange}/refused.unbound"  # no queue binds it: basic.return, then Rejected

        async def publish_foreign(target: str) -> None:
            exchange, routing_key = split_target(target)
            conn = await aio_pika.connect(rabbitmq_url, timeout=5)
            async with conn:
                channel = await conn.channel()
                ex = await channel.get_exchange(exchange, ensure=False)
                await ex.publish(aio_pika.Message(b"not a cloudevent"), routing_key=routing_key)

        async def forget_group(target: str, group: str) -> None:
            base = group_queue(group, split_target(target)[0])  # deleted with the exchanges at teardown
            exchanges.queues += [base, f"{base}.members", *(f"{base}.{i}" for i in range(SHARDS))]
            exchanges.exchanges.insert(0, base)

        def make(target: str, url: str, *, wait: float | None = None) -> RabbitMQTransport:
            """``wait``: connect_timeout and confirm_timeout (else 2 s and 5 s) for the fault checks' transports."""
            exchange, routing_key = split_target(target)
            cfg = RabbitMQConfig(
                url=url,
                password=secret,
                exchange=exchange,
                routing_key=routing_key,
                connect_timeout=wait or 2,
                confirm_timeout=wait or 5,
            )
            return RabbitMQTransport(cfg, destination="conformance")

        parts = urlsplit(rabbitmq_url)
        yield ConformanceTarget(
            make_transport=lambda target: make(target, url),
            provision=provision,
            make_unreachable=lambda target: make(target, _netloc(url, "127.0.0.1", free_port())),
            unsupported=RabbitMQTransport.conformance_unsupported,  # declared once, on the class
            label="rabbitmq (real RabbitMQ 3.10 broker" + (", users of the run)" if user else ")"),
            read_timeout=10.0,
            upstream=lambda target: (parts.hostname or "127.0.0.1", parts.port or 5672),
            # a stalled or black-holed connect or publish costs each fault check this long
            make_transport_via=lambda target, host, port: make(target, _netloc(url, host, port), wait=VIA_TIMEOUT),
            refuse_target=refuse,
            make_forbidden=(lambda target: make(target, _login(rabbitmq_url, f"{user}-ro"))) if user else None,
            secret=secret,
            binding=AMQP,
            publish_foreign=publish_foreign,
            forget_group=forget_group,
            claim_timeout=2.0,  # the heartbeat: RabbitMQ's least is 2 s
        )
        await exchanges.delete_all()
