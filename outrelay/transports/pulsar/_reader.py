"""Consumer side of the ``pulsar`` transport (used by the conformance suite).

An exclusive subscription with a unique name, starting at the latest
message, so the reader sees what is published after :meth:`start`. Each
message is acknowledged once read and decoded back to the :class:`Event`
from its ``ce_*`` properties (CloudEvents binary mode, :func:`~._wire.decode`).
Pulsar delivers at least once: after a reconnect a message may be read twice.

:raises RetryableError: the broker does not answer within
    ``connect_timeout + operation_timeout + 2`` seconds, or fails transiently.
:raises PermanentError: refused credentials, an invalid topic.
"""

from __future__ import annotations

import contextlib
import uuid
from typing import Any

import pulsar

from outrelay.kit import Reader, Received, read_until
from outrelay.transports.pulsar._client import Blocking, make_client
from outrelay.transports.pulsar._config import PulsarConfig
from outrelay.transports.pulsar._wire import decode

__all__ = ["PulsarReader"]


class PulsarReader(Reader):
    """See the module docstring."""

    def __init__(
        self, cfg: PulsarConfig, topic: str, *, destination: str = "pulsar", subscription: str | None = None
    ) -> None:
        self.cfg = cfg
        self.destination = destination
        self.topic = topic
        self.subscription = subscription or f"outrelay-reader-{uuid.uuid4().hex[:12]}"
        self.client: Any = None
        self.consumer: Any = None
        self._blocking: Blocking | None = None

    async def start(self) -> None:
        bound = self.cfg.connect_timeout + self.cfg.operation_timeout + 2
        self._blocking = blocking = Blocking(
            1, bound=bound, destination=self.destination, name="outrelay-pulsar-reader"
        )
        self.client = make_client(self.cfg)
        self.consumer = await blocking.call(
            f"pulsar subscribe {self.topic}",
            self.client.subscribe,
            self.topic,
            self.subscription,
            consumer_type=pulsar.ConsumerType.Exclusive,
            initial_position=pulsar.InitialPosition.Latest,
        )

    async def read(self, count: int, timeout: float) -> list[Received]:
        blocking = self._blocking
        assert blocking is not None, "read() before start()"

        async def poll(_room: int, seconds: float) -> list[Received]:
            return await blocking.call("pulsar receive", self._receive, seconds)

        return await read_until(count, timeout, poll, step=0.5)

    def _receive(self, seconds: float) -> list[Received]:
        """At most one message, acknowledged (in the pool's thread: ``receive`` blocks)."""
        try:
            msg = self.consumer.receive(timeout_millis=max(1, int(seconds * 1000)))
        except pulsar.Timeout:
            return []
        self.consumer.acknowledge(msg)
        return [decode(self.topic, msg)]

    async def stop(self) -> None:
        blocking, self._blocking = self._blocking, None
        if blocking is None:
            return
        for obj in (self.consumer, self.client):
            if obj is not None:
                with contextlib.suppress(Exception):  # best effort: the broker drops the session anyway
                    await blocking.call("pulsar close", obj.close)
        self.consumer = self.client = None
        blocking.shutdown()
