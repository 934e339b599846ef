"""The ``file`` transport: CloudEvents JSON Lines appended to a file.

For the demo and for debugging. Each message is one line, the structured
CloudEvents form; ``fsync = true`` makes "delivered" mean "on disk". The
path may be a template (``"out/{stream}.jsonl"``); parent directories are
created. The reader tails the file.

Open handles are bounded: at most ``max_open_files`` stay open (least
recently used closed first, after a flush — and an fsync with ``fsync``),
and a handle unused for ``idle_close_seconds`` is closed, so a template
that fans out to thousands of files never runs the process out of file
descriptors.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from pydantic import Field

from outrelay.kit import (
    STRUCTURED_CONTENT_TYPE,
    Capabilities,
    Delivered,
    Event,
    LifecycleTransport,
    Message,
    PermanentError,
    Reader,
    Received,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    TransportConfig,
    from_structured,
    hookimpl,
    to_structured,
)

if TYPE_CHECKING:
    from outrelay.kit import Registry

__all__ = ["FileConfig", "FileTransport"]


class FileConfig(TransportConfig):
    path: str = "outrelay-events.jsonl"
    fsync: bool = False
    max_open_files: int = Field(32, ge=1, le=10_000, description="open handles kept (least recently used closed first)")
    idle_close_seconds: float = Field(30.0, gt=0, description="a handle unused this long is closed")


class FileTransport(LifecycleTransport[FileConfig]):
    """See the module docstring (open/close rules: :class:`~outrelay.kit.LifecycleTransport`)."""

    name = "file"
    Config = FileConfig
    target_option = "path"
    target_segment = "path"

    def __init__(self, config: FileConfig, *, destination: str = "file") -> None:
        super().__init__(config, destination=destination)
        self._files: OrderedDict[str, IO[bytes]] = OrderedDict()  # least recently used first
        self._used: dict[str, float] = {}  # target -> monotonic time of its last write
        self._lock = threading.Lock()

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(ordered_batches=True, max_batch_count=1000, cloudevents_modes=("structured",), reader=True)

    def _write(self, batch: Sequence[Message]) -> list[SendResult]:
        with self._lock:  # concurrent send() calls share the open handles
            return self._write_locked(batch)

    def _write_locked(self, batch: Sequence[Message]) -> list[SendResult]:
        results: list[SendResult] = []
        touched: set[str] = set()
        failed: set[str] = set()
        for m in batch:
            if m.key in failed:
                results.append(RetryLater("an earlier message with this key failed"))
                continue
            try:
                fh = self._handle(m.target)
                fh.write(to_structured(m.event) + b"\n")
                touched.add(m.target)
                results.append(Delivered())
            except OSError as exc:
                failed.add(m.key)
                results.append(RetryLater(f"cannot write {m.target}: {exc.strerror}"))
            except ValueError as exc:  # e.g. a NUL byte in the rendered path: no retry will help
                failed.add(m.key)
                results.append(Rejected(f"invalid file path {m.target!r}: {exc}"))
        for target in touched:
            handle = self._files.get(target)
            if handle is not None:  # else flushed when it was evicted
                self._flush(target, handle)
        self._close_idle()
        return results

    def _handle(self, target: str) -> IO[bytes]:
        """The open handle of ``target``, opening it (and evicting the least recently used) if needed."""
        self._used[target] = time.monotonic()
        known = self._files.get(target)
        if known is not None:
            self._files.move_to_end(target)
            return known
        while len(self._files) >= self.cfg.max_open_files:
            old, old_fh = self._files.popitem(last=False)
            self._used.pop(old, None)
            try:
                self._flush(old, old_fh)
            finally:
                old_fh.close()
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        fh = self._files[target] = open(target, "ab")  # noqa: SIM115 - kept open, closed by LRU/idle/close()
        return fh

    def _flush(self, target: str, fh: IO[bytes]) -> None:
        try:
            fh.flush()
            if self.cfg.fsync:
                os.fsync(fh.fileno())
        except OSError as exc:
            raise RetryableError(f"cannot flush {target}: {exc.strerror}", destination=self.destination) from exc

    def _close_idle(self) -> None:
        """Close handles unused for ``idle_close_seconds`` (already flushed: every batch flushes what it wrote)."""
        horizon = time.monotonic() - self.cfg.idle_close_seconds
        for target in [t for t in self._files if self._used.get(t, 0.0) < horizon]:
            self._files.pop(target).close()
            self._used.pop(target, None)

    async def _open(self) -> None:
        """Nothing to connect: files are opened on first write."""

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        return await asyncio.to_thread(self._write, batch)

    async def _close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()
            self._used.clear()

    async def _check(self) -> str:
        path = Path(self.target(Event(type="check", stream="check")))
        existing = path.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not existing.is_dir():
            raise PermanentError(
                f"{str(existing)!r} is not a directory, so {str(path)!r} cannot be created; fix `path`",
                destination=self.destination,
            )
        if not os.access(existing, os.W_OK):
            raise RetryableError(f"directory {str(existing)!r} is not writable", destination=self.destination)
        return f"writes to {self.cfg.path}"

    def reader(self, target: str, **options: Any) -> Reader:
        return FileReader(target)


class FileReader(Reader):
    """Tails one file from its size at :meth:`start`."""

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


@hookimpl
def outrelay_add_transports(registry: Registry) -> None:
    registry.add_transport("file", FileTransport)
