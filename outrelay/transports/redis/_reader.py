"""Consumer side of the ``redis`` transport: a Redis Streams consumer group.

``start`` creates the group at the stream's end (``$``; ``0`` with
``from_beginning=True``), creating the stream if needed (``MKSTREAM``), so
the reader sees what is appended afterwards. ``read`` uses ``XREADGROUP``
and acknowledges (``XACK``) what it returns. A group the reader generated
itself (no ``group`` given) is destroyed on ``stop``; a named group stays,
so a later reader with the same name resumes after the last acknowledged
entry.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from redis import exceptions as rx

from outrelay.kit import Reader, Received
from outrelay.transports.redis._client import open_client
from outrelay.transports.redis._config import RedisConfig
from outrelay.transports.redis._errors import map_redis_errors
from outrelay.transports.redis._wire import decode

__all__ = ["RedisReader", "decode"]


class RedisReader(Reader):
    """See the module docstring."""

    def __init__(
        self,
        cfg: RedisConfig,
        key: str,
        *,
        group: str | None = None,
        consumer: str = "outrelay-reader",
        from_beginning: bool = False,
    ) -> None:
        self.cfg = cfg
        self.key = key
        self.group = group or f"outrelay-reader-{uuid.uuid4().hex[:12]}"
        self._own_group = group is None
        self.consumer = consumer
        self.from_beginning = from_beginning
        self._client: Any = None

    async def start(self) -> None:
        client, _ = await open_client(self.cfg, f"reader of {self.key}")
        try:
            with map_redis_errors(f"XGROUP CREATE {self.key}", f"reader of {self.key}"):
                try:
                    await client.xgroup_create(
                        self.key, self.group, id="0" if self.from_beginning else "$", mkstream=True
                    )
                except rx.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):  # an existing named group resumes where it was
                        raise
        except BaseException:
            await client.aclose()
            raise
        self._client = client

    async def read(self, count: int, timeout: float) -> list[Received]:
        client = self._client
        if client is None:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        with map_redis_errors(f"XREADGROUP {self.key}", f"reader of {self.key}"):
            while len(out) < count:
                left = deadline - loop.time()
                if left <= 0:
                    break
                block = max(1, int(min(left, 1.0) * 1000))
                reply = await client.xreadgroup(
                    self.group, self.consumer, {self.key: ">"}, count=count - len(out), block=block
                )
                ids = []
                for _key, entries in reply or ():
                    for entry_id, fields in entries:
                        ids.append(entry_id)
                        out.append(decode(self.key, fields))
                if ids:
                    await client.xack(self.key, self.group, *ids)
        return out

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self._own_group:
                with map_redis_errors(f"XGROUP DESTROY {self.key}", f"reader of {self.key}"):
                    await client.xgroup_destroy(self.key, self.group)
        finally:
            await client.aclose()
