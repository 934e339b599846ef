"""The memory transport's reader: what one target of an in-process broker received."""

from __future__ import annotations

import asyncio
import contextlib

from outrelay.kit import Reader, Received
from outrelay.transports.memory._broker import MemoryBroker

__all__ = ["MemoryReader"]


class MemoryReader(Reader):
    """Reads messages published to one target after :meth:`start` (``from_beginning``: all of them)."""

    def __init__(self, broker: MemoryBroker, target: str, *, from_beginning: bool = False) -> None:
        self.broker = broker
        self.target = target
        self.from_beginning = from_beginning
        self._pos = 0
        self._event = asyncio.Event()

    async def start(self) -> None:
        self._pos = 0 if self.from_beginning else len(self.broker.messages[self.target])
        self.broker.waiters.append(self._event)

    async def read(self, count: int, timeout: float) -> list[Received]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            msgs = self.broker.messages[self.target]
            if len(msgs) - self._pos >= count or loop.time() >= deadline:
                out = msgs[self._pos : self._pos + count]
                self._pos += len(out)
                return out
            self._event.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._event.wait(), timeout=max(0.0, deadline - loop.time()))

    async def stop(self) -> None:
        if self._event in self.broker.waiters:
            self.broker.waiters.remove(self._event)
