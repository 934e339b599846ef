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
from typing import Any

import aio_pika.abc

from outrelay.core import cloudevents
from outrelay.core.errors import UsageError
from outrelay.core.transport import Reader, Received
from outrelay.transports.rabbitmq._config import RabbitMQConfig, split_target
from outrelay.transports.rabbitmq._errors import VENDOR_ERRORS, mapped

__all__ = ["RabbitMQReader"]


def _text(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes | bytearray) else str(value)


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
        from outrelay.transports.rabbitmq._transport import connect

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
            headers = {k: _text(v) for k, v in (msg.headers or {}).items()}
            event = cloudevents.from_binary(headers, msg.body, content_type=msg.content_type, prefix="cloudEvents_")
            key = headers.get("cloudEvents_partitionkey")
            target = f"{msg.exchange or ''}/{msg.routing_key or ''}"
            out.append(Received(event, target, key, headers, bytes(msg.body), msg.content_type))
            with mapped("cannot ack", self.destination, self.cfg.secrets()):
                await msg.ack()
        return out

    async def stop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed:
            with contextlib.suppress(*VENDOR_ERRORS, RuntimeError):
                await conn.close()
