"""Reader of the ``pubsub`` transport: a pull subscription created per reader.

``start`` creates a fresh subscription on the topic (message ordering on
when the transport orders), so the reader sees exactly what is published
after it started; ``stop`` deletes it. Messages are acked as soon as they
are read, which with ordering releases the next message of the key.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from google.api_core import exceptions as gexc

from outrelay.kit import Reader, Received, UsageError
from outrelay.transports.pubsub._client import make_subscriber
from outrelay.transports.pubsub._config import PubSubConfig
from outrelay.transports.pubsub._errors import ERRORS
from outrelay.transports.pubsub._wire import decode

__all__ = ["PubSubReader"]


class PubSubReader(Reader):
    """Reads one topic through its own pull subscription (see module docstring)."""

    def __init__(self, cfg: PubSubConfig, topic: str, *, ordering: bool, subscription: str | None = None) -> None:
        self.cfg = cfg
        self.topic = topic
        self.ordering = ordering
        self.subscription = cfg.subscription_path(subscription or f"outrelay-reader-{uuid.uuid4().hex[:12]}")
        self._client: Any = None
        self._buffer: list[Received] = []

    async def start(self) -> None:
        """Create this reader's subscription. :raises RetryableError/PermanentError: as ``_errors.ERRORS``."""

        def create() -> Any:
            client = make_subscriber(self.cfg)
            try:
                client.create_subscription(
                    request={
                        "name": self.subscription,
                        "topic": self.topic,
                        "enable_message_ordering": self.ordering,
                        "ack_deadline_seconds": 60,
                    },
                    timeout=self.cfg.open_timeout * 2,
                )
            except BaseException:
                client.close()
                raise
            return client

        with ERRORS.boundary(f"cannot create a subscription on {self.topic}"):
            self._client = await asyncio.to_thread(create)

    def _pull(self, max_messages: int, timeout: float) -> list[Received]:
        try:
            resp = self._client.pull(
                request={"subscription": self.subscription, "max_messages": max_messages},
                timeout=max(timeout, 0.5),
                retry=None,
            )
        except (gexc.DeadlineExceeded, gexc.RetryError):
            return []
        if not resp.received_messages:
            return []
        self._client.acknowledge(
            request={"subscription": self.subscription, "ack_ids": [r.ack_id for r in resp.received_messages]}
        )
        return [decode(r.message, self.topic) for r in resp.received_messages]

    async def read(self, count: int, timeout: float) -> list[Received]:
        if self._client is None:
            raise UsageError("reader is not started")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._buffer) < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            got = await asyncio.to_thread(self._pull, min(1000, count - len(self._buffer)), min(left, 2.0))
            self._buffer.extend(got)
        out, self._buffer = self._buffer[:count], self._buffer[count:]
        return out

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return

        def delete() -> None:
            try:
                client.delete_subscription(request={"subscription": self.subscription}, timeout=5)
            except Exception:  # best effort: the subscription expires on its own
                pass
            finally:
                client.close()

        await asyncio.to_thread(delete)
