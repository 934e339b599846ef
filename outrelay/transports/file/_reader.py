"""The file transport's reader: tails one JSON Lines file."""

from __future__ import annotations

import asyncio
import os

from outrelay.kit import STRUCTURED_CONTENT_TYPE, Reader, Received, from_structured

__all__ = ["FileReader"]


class FileReader(Reader):
    """Tails one file from its size at :meth:`start`; each line is one structured CloudEvent."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._pos = 0
        self._buf = b""
        self._ready: list[Received] = []

    def _size(self) -> int:
        return os.path.getsize(self.path) if os.path.exists(self.path) else 0

    def _read_new(self) -> bytes:
        if not os.path.exists(self.path):
            return b""
        with open(self.path, "rb") as fh:
            fh.seek(self._pos)
            return fh.read()

    async def start(self) -> None:
        self._pos = await asyncio.to_thread(self._size)

    async def read(self, count: int, timeout: float) -> list[Received]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(self._ready) < count:
            chunk = await asyncio.to_thread(self._read_new)
            if chunk:
                self._pos += len(chunk)
                self._buf += chunk
                *lines, self._buf = self._buf.split(b"\n")
                for line in lines:
                    ev = from_structured(line)
                    self._ready.append(Received(ev, self.path, ev.stream, {}, line, STRUCTURED_CONTENT_TYPE))
            if len(self._ready) >= count or loop.time() >= deadline:
                break
            await asyncio.sleep(0.01)
        out, self._ready = self._ready[:count], self._ready[count:]
        return out

    async def stop(self) -> None:
        return None
