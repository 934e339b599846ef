"""Reader of the ``rabbitmq`` transport: a queue consumer.

``transport.reader("exchange/routing.key")`` declares a server-named,
exclusive, auto-delete queue bound to the exchange with the routing key, so
it sees what is published after :meth:`RabbitMQReader.start` and vanishes
with the reader. ``reader(target, queue="name")`` consumes an existing
(durable) queue instead; a target on the default exchange (``"/name"``)
consumes the queue ``name``. Messages are acked once read and rebuilt into
an :class:`~outrelay.Event` from their ``cloudEvents_*`` headers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

import aio_pika.abc

from outrelay.kit import Reader, Received, UsageError, from_binary
from outrelay.transports.rabbitmq._client import connect
from outrelay.transports.rabbitmq._config import RabbitMQConfig, split_target
from outrelay.transports.rabbitmq._errors import VENDOR_ERRORS, mapped

__all__ = ["RabbitMQReader", "decode"]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


def decode(
    headers: Mapping[str, Any] | None,
    body: bytes,
    content_type: str | None,
    exchange: str | None,
    routing_key: str | None,
) -> Received:
    """A delivered message rebuilt from its ``cloudEvents_*`` headers (shared with the subscriber).

    :raises EventError: (or another ValueError) the message is not an outrelay CloudEvent.
    """
    text = {k: _text(v) for k, v in (headers or {}).items()}
    event = from_binary(text, body, content_type=content_type, prefix="cloudEvents_")
    target = f"{exchange or ''}/{routing_key or ''}"
    return Received(event, target, text.get("cloudEvents_partitionkey"), text, bytes(body), content_type)


class RabbitMQReader(Reader):
    """See the module docstring.

    :raises RetryableError: (start) broker unreachable or the exchange missing.
    :raises PermanentError: (start) access refused.
    """

    def __init__(
        self, cfg: RabbitMQConfig, target: str, *, destination: str = "rabbitmq", queue: str | None = None
    ) -> None:
        self.cfg = cfg
        self.target = target
        self.destination = destination
        self.queue_name = queue
        self._conn: aio_pika.abc.AbstractConnection | None = None
        self._inbox: asyncio.Queue[aio_pika.abc.AbstractIncomingMessage] = asyncio.Queue()

    async def start(self) -> None:
        self._conn = await connect(self.cfg, self.destination, name="outrelay reader")
        exchange, routing_key = split_target(self.target)
        try:
            with mapped(f"cannot consume {self.target!r}", self.destination, self.cfg.secrets()):
                channel = await self._conn.channel(publisher_confirms=False)
                await channel.set_qos(prefetch_count=1000)
                if self.queue_name or not exchange:
                    queue = await channel.declare_queue(self.queue_name or routing_key, passive=True)
                else:
                    queue = await channel.declare_queue(exclusive=True, auto_delete=True)
                    await queue.bind(exchange, routing_key)
                await queue.consume(self._inbox.put)
        except BaseException:
            await self.stop()
            raise

    async def read(self, count: int, timeout: float) -> list[Received]:
        if self._conn is None:
            raise UsageError("RabbitMQReader.read() before start()")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        while len(out) < count:
            try:
                msg = self._inbox.get_nowait()
            except asyncio.QueueEmpty:
                left = deadline - loop.time()
                if left <= 0:
                    break
                try:
                    msg = await asyncio.wait_for(self._inbox.get(), left)
                except TimeoutError:
                    break
            out.append(decode(msg.headers, msg.body, msg.content_type, msg.exchange, msg.routing_key))
            with mapped("cannot ack", self.destination, self.cfg.secrets()):
                await msg.ack()
        return out

    async def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed:
            with contextlib.suppress(*VENDOR_ERRORS, RuntimeError):
                await conn.close()
