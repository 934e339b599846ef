"""The batch publisher (outrelay/transports/rabbitmq/_publish.py): aiormq's bytes and bookkeeping, in one write."""

from __future__ import annotations

import asyncio
import datetime
import uuid

import aio_pika
import aiormq
import pytest
from aiormq import spec
from aiormq.abc import ChannelFrame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader

from outrelay.transports.rabbitmq._publish import Staged, publish_frames
from outrelay.transports.rabbitmq._wire import Properties
from tests.peers.rabbitmq import ExchangeFactory


def _properties(**values: object) -> Properties:
    base: dict[str, object] = {
        "headers": {"cloudEvents_id": "e-1", "cloudEvents_type": "t"},
        "content_type": "application/json",
        "delivery_mode": 2,
        "priority": 0,
        "message_id": str(uuid.uuid4()),
        "timestamp": datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        "message_type": "t",
    }
    base.update(values)
    return Properties(**base)  # type: ignore[arg-type]


def _aiormq_bytes(
    channel: int, exchange: str, key: str, mandatory: bool, props: Properties, body: bytes, max_content: int
) -> bytes:
    """What aiormq's basic_publish puts on the write queue for the same message (its own code path)."""
    frames: list[object] = [
        spec.Basic.Publish(exchange=exchange, routing_key=key, mandatory=mandatory),
        ContentHeader(properties=props, body_size=len(body)),
    ]
    if body:  # aiormq's _split_body
        frames += [ContentBody(body[i : i + max_content]) for i in range(0, len(body), max_content)]
    return ChannelFrame.marshall(channel_number=channel, frames=frames).payload  # type: ignore[arg-type]


@pytest.mark.parametrize("size", [0, 1, 1024, 131_064, 131_065, 400_000])
@pytest.mark.parametrize("mandatory", [True, False])
def test_frames_are_the_bytes_aiormq_writes(size: int, mandatory: bool) -> None:
    """Method, header and body frames (split at frame_max) match aiormq's marshalling byte for byte."""
    body, props, max_content = bytes(range(256)) * (size // 256) + b"x" * (size % 256), _properties(), 131_064
    ours = publish_frames(7, "ex.orders", "k.strøm", mandatory, props.marshal(), body, max_content)
    assert ours == _aiormq_bytes(7, "ex.orders", "k.strøm", mandatory, props, body, max_content)


def test_the_channel_members_it_relies_on_exist() -> None:
    """aiormq still has the channel attributes the publisher uses (an upgrade that drops one fails here)."""
    members = ("lock", "delivery_tag", "confirmations", "message_id_delivery_tag", "write_queue", "number",
               "max_content_size", "create_future", "publisher_confirms")  # fmt: skip
    init = aiormq.Channel.__init__.__code__.co_names + tuple(dir(aiormq.Channel))
    assert [m for m in members if m not in init] == []


class TestOnABroker:
    async def _channel(self, url: str) -> tuple[aio_pika.abc.AbstractConnection, aiormq.Channel]:
        conn = await aio_pika.connect(url)
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        return conn, await channel.get_underlay_channel()  # type: ignore[return-value]

    async def test_one_write_confirms_each_message_and_returns_the_unroutable_one(
        self, rabbitmq_url: str, rabbitmq_exchanges: ExchangeFactory
    ) -> None:
        """Messages staged together are confirmed one by one; a mandatory message no queue takes is
        returned (PublishError) while its neighbours are delivered, and the channel's maps end empty."""
        ex = await rabbitmq_exchanges("stg")
        queue = await rabbitmq_exchanges.queue(ex, "ok.#")
        conn, wire = await self._channel(rabbitmq_url)
        try:
            staged = Staged(wire, mandatory=True)
            keys = ["ok.1", "ok.2", "nobody", "ok.3"]
            futures = [staged.stage(k.encode(), _properties(), ex, k) for k in keys]
            await staged.write()
            done = await asyncio.gather(*futures, return_exceptions=True)
            assert [type(d).__name__ for d in done] == ["Ack", "Ack", "PublishError", "Ack"]
            assert wire.delivery_tag == 4 and not wire.message_id_delivery_tag
            # a second group on the same object goes on with the next delivery tags
            again = [staged.stage(b"more", _properties(), ex, "ok.4")]
            await staged.write()
            assert [type(d).__name__ for d in await asyncio.gather(*again)] == ["Ack"] and wire.delivery_tag == 5
            channel = await conn.channel()
            q = await channel.declare_queue(queue, passive=True)
            bodies = []
            while (msg := await q.get(timeout=5, fail=False)) is not None:
                bodies.append(msg.body)
                await msg.ack()
            assert bodies == [b"ok.1", b"ok.2", b"ok.3", b"more"]
        finally:
            await conn.close()

    async def test_a_closed_channel_fails_everything_staged(self, rabbitmq_url: str) -> None:
        """A write on a closed channel sends nothing; every staged future fails with the channel's error
        (the channel's own future store rejects them as it closes)."""
        conn, wire = await self._channel(rabbitmq_url)
        try:
            staged = Staged(wire, mandatory=False)
            futures = [staged.stage(b"x", _properties(), "", "k") for _ in range(3)]
            await wire.close()
            with pytest.raises(aiormq.exceptions.ChannelInvalidStateError):
                await staged.write()
            closed = (aiormq.exceptions.ChannelClosed, aiormq.exceptions.ChannelInvalidStateError)
            assert all(isinstance(f.exception(), closed) for f in futures)
            assert not wire.confirmations
        finally:
            await conn.close()
