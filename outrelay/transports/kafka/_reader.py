"""Consumer side of the ``kafka`` transport (an aiokafka consumer group).

With ``group_id`` the reader joins that consumer group (offsets auto-committed,
partitions shared with the group's other members), waits for its assignment
and resumes from the group's committed offsets (a new group starts at the
end); without one it assigns itself every partition of the topic (no group
coordination, which takes seconds on some brokers) from their end. Either
way positions are resolved before ``start`` returns, so nothing published
afterwards is missed; ``from_beginning=True`` starts at the beginning. Each
record is decoded back to the original Event from the ``ce_*`` headers or
the structured JSON value (:func:`~._wire.decode`).

:raises RetryableError: from ``start`` when the broker is unreachable or the
    group assigns no partition within ``connect_timeout``; from ``read`` when
    the broker fails.
:raises PermanentError: from ``start`` or ``read``: not authorized, an illegal topic.
"""

from __future__ import annotations

import asyncio

from aiokafka import AIOKafkaConsumer, TopicPartition

from outrelay.kit import Reader, Received, RetryableError, read_until
from outrelay.transports.kafka._client import client_options, partitions, seek_all
from outrelay.transports.kafka._config import KafkaConfig
from outrelay.transports.kafka._errors import ERRORS
from outrelay.transports.kafka._wire import decode

__all__ = ["KafkaReader"]


class KafkaReader(Reader):
    """See the module docstring."""

    def __init__(
        self, cfg: KafkaConfig, topic: str, *, group_id: str | None = None, from_beginning: bool = False
    ) -> None:
        self.cfg = cfg
        self.topic = topic
        self.group_id = group_id
        self.from_beginning = from_beginning
        self._consumer: AIOKafkaConsumer | None = None
        self._where = f"kafka reader of {topic!r}"

    async def start(self) -> None:
        with ERRORS.boundary(f"{self._where}: subscribe"):
            consumer = AIOKafkaConsumer(
                *((self.topic,) if self.group_id else ()),
                **client_options(self.cfg),
                group_id=self.group_id,
                auto_offset_reset="earliest" if self.from_beginning else "latest",
                enable_auto_commit=self.group_id is not None,
            )
            try:
                await self._position(consumer)
            except BaseException:
                await consumer.stop()
                raise
        self._consumer = consumer

    async def _position(self, consumer: AIOKafkaConsumer) -> None:
        """Start ``consumer``, get its partitions (assigned by the group or taken), resolve their positions."""
        timeout = self.cfg.connect_timeout
        async with asyncio.timeout(timeout + (15 if self.group_id else 0)):
            await consumer.start()  # joining a group may wait out a departed member's session (10 s by default)
        if not self.group_id:
            consumer.assign([TopicPartition(self.topic, p) for p in await partitions(consumer, self.topic, timeout)])
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not consumer.assignment():
            if loop.time() > deadline:
                raise RetryableError(f"{self._where}: the consumer group got no partitions")
            await asyncio.sleep(0.02)
        await seek_all(
            consumer, list(consumer.assignment()), from_beginning=self.from_beginning, to_end=not self.group_id
        )

    async def read(self, count: int, timeout: float) -> list[Received]:
        consumer = self._consumer
        if consumer is None:
            return []

        async def poll(room: int, seconds: float) -> list[Received]:
            batches = await consumer.getmany(timeout_ms=int(seconds * 1000), max_records=room)
            return [decode(r.topic, r.key, r.value, r.headers) for records in batches.values() for r in records]

        with ERRORS.boundary(f"{self._where}: read"):
            return await read_until(count, timeout, poll, step=0.5)

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
