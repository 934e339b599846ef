"""Consumer side of the ``pulsar`` transport (used by the conformance suite).

An exclusive subscription with a unique name, starting at the latest
message, so the reader sees what is published after :meth:`start`. Each
message is acknowledged once read and decoded back to the :class:`Event`
from its ``ce_*`` properties (CloudEvents binary mode). Pulsar delivers at
least once: after a reconnect a message may be read twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

import pulsar

from outrelay.kit import Reader, Received, from_binary
from outrelay.transports.pulsar._errors import call_blocking

if TYPE_CHECKING:
    from outrelay.transports.pulsar._transport import PulsarTransport

__all__ = ["PulsarReader"]


class PulsarReader(Reader):
    """See the module docstring."""

    def __init__(self, transport: PulsarTransport, topic: str, *, subscription: str | None = None) -> None:
        self.transport = transport
        self.topic = topic
        self.subscription = subscription or f"outrelay-reader-{uuid.uuid4().hex[:12]}"
        self.client: Any = None
        self.consumer: Any = None
        self._pool: ThreadPoolExecutor | None = None

    async def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        assert self._pool is not None
        cfg = self.transport.cfg
        timeout = cfg.connect_timeout + cfg.operation_timeout + 2
        return await call_blocking(self._pool, timeout, what, self.transport.destination, fn, *args, **kwargs)

    async def start(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="outrelay-pulsar-reader")
        self.client = self.transport.make_client()
        self.consumer = await self._call(
            f"pulsar subscribe {self.topic}",
            self.client.subscribe,
            self.topic,
            self.subscription,
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Latest,
        )

    async def read(self, count: int, timeout: float) -> list[Received]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        while len(out) < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            msg = await self._call("pulsar receive", self._receive, min(left, 0.5))
            if msg is not None:
                out.append(msg)
        return out

    def _receive(self, seconds: float) -> Received | None:
        try:
            msg = self.consumer.receive(timeout_millis=max(1, int(seconds * 1000)))
        except pulsar.Timeout:
            return None
        self.consumer.acknowledge(msg)
        props = dict(msg.properties())
        data = bytes(msg.data())
        event = from_binary(props, data, content_type=props.get("content-type"), prefix="ce_")
        return Received(event, self.topic, msg.partition_key() or None, props, data, props.get("content-type"))

    async def stop(self) -> None:
        if self._pool is None:
            return
        for obj in (self.consumer, self.client):
            if obj is not None:
                # Closing is best effort: the broker drops the session anyway.
                with contextlib.suppress(Exception):
                    await self._call("pulsar close", obj.close)
        self.consumer = self.client = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._pool = None
