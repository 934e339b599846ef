"""The ``file`` transport: CloudEvents JSON Lines appended to a file.

For the demo and for debugging. Each message is one line, the structured
CloudEvents form; ``fsync = true`` makes "delivered" mean "on disk". The
path may be a template (``"out/{stream}.jsonl"``); parent directories are
created. The reader (:mod:`._reader`) tails the file.

Open handles are bounded: at most ``max_open_files`` stay open (least
recently used closed first, after a flush — and an fsync with ``fsync``),
and a handle unused for ``idle_close_seconds`` is closed, so a template
that fans out to thousands of files never runs the process out of file
descriptors.

Writes run in a worker thread, message by message in batch order (after a
stream's failure its later lines are not written). When the send is cut
(``attempt_timeout``, shutdown), the thread starts no further line, what it
wrote is flushed, and those outcomes are recorded in the relay's progress
before the cut goes on, so no line is written twice. A failing flush fails
the whole batch (RetryableError).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from outrelay.kit import (
    Capabilities,
    Delivered,
    LifecycleTransport,
    Message,
    PermanentError,
    Reader,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    current_progress,
    send_each,
    to_structured,
)
from outrelay.transports.file._config import FileConfig
from outrelay.transports.file._reader import FileReader

__all__ = ["FileTransport"]


class FileTransport(LifecycleTransport[FileConfig]):
    """Appends one JSON line per message to the file its ``path`` renders to; see the module
    docstring, and :class:`~outrelay.kit.LifecycleTransport` for the open/close rules."""

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

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        progress = current_progress()
        cut = threading.Event()  # set when the send is cancelled: the thread starts no further line
        work = asyncio.ensure_future(asyncio.to_thread(self._write, batch, cut))
        try:
            results = await asyncio.shield(work)
        except asyncio.CancelledError:
            cut.set()
            # what the thread wrote is on its way to disk: wait for it (a line or two) and keep it
            with contextlib.suppress(Exception):  # a failing flush: nothing to keep
                progress.record(batch, await work)
            raise
        progress.record(batch, results)
        return results

    def _write(self, batch: Sequence[Message], cut: threading.Event) -> list[SendResult]:
        """Write ``batch`` in a worker thread; the send's progress is the caller's
        (``asyncio.to_thread`` runs this in a copy of the caller's context)."""
        with self._lock:  # concurrent send() calls share the open handles
            touched: set[str] = set()
            results = send_each(batch, lambda m: self._line(m, touched), progress=current_progress(), halt=cut.is_set)
            for target in touched:
                handle = self._files.get(target)
                if handle is not None:  # else flushed when it was evicted
                    self._flush(target, handle)
            self._close_idle()
            return results

    def _line(self, m: Message, touched: set[str]) -> SendResult:
        try:
            self._handle(m.target).write(to_structured(m.event) + b"\n")
        except OSError as exc:
            return RetryLater(f"cannot write {m.target}: {exc.strerror}")
        except ValueError as exc:  # e.g. a NUL byte in the rendered path: no retry will help
            return Rejected(f"invalid file path {m.target!r}: {exc}")
        touched.add(m.target)
        return Delivered()

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

    async def _close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()
            self._used.clear()

    async def _check(self) -> str:
        path = Path(self.check_target())
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
