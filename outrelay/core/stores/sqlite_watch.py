"""Cross-process wake-ups for the SQLite outbox: notice another process's
committed append within a few milliseconds, without busy polling.

SQLite has no LISTEN/NOTIFY. A commit in WAL mode writes its frames to the
``-wal`` file with ``write()``, then makes them visible through the shared
wal-index. :class:`CommitWatcher` runs one daemon thread:

* **Linux**: it blocks on an ``inotify`` watch of the database's directory
  (events for the ``-wal`` file only), so an idle relay costs nothing. The
  ``write()`` is seen slightly *before* the commit is visible (the fsync
  comes between), so after each event the thread checks every millisecond
  for ``HOT_WINDOW`` seconds; a check that finds a new last event ``seq``
  calls the callback.
* **Elsewhere** (or if inotify is unavailable) it polls: every 2 ms while
  appends keep coming, backing off to 50 ms after a second of quiet.

A check is ``PRAGMA data_version`` (a read of the shared wal-index header,
no table access) and, only when that moved, ``SELECT MAX(seq)`` on the
watcher's own read-only connection; so the relay's own bookkeeping writes
(route, claim, settle) never wake it. Missed notices are harmless: the relay
still polls every ``relay.poll_interval``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import select
import sqlite3
import struct
import sys
import threading
import time
from collections.abc import Callable

__all__ = ["CommitWatcher"]

log = logging.getLogger("outrelay.relay")

HOT_WINDOW = 0.1  # seconds of 1 ms checks after a WAL write (covers the commit's fsync)
_IN_MODIFY, _IN_CREATE, _IN_MOVED_TO = 0x2, 0x100, 0x80
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, len (then len bytes of name)


def _inotify(directory: str) -> int | None:
    """An inotify fd watching ``directory`` for writes, or None where unsupported."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fd = int(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
        if fd < 0:
            return None
        mask = _IN_MODIFY | _IN_CREATE | _IN_MOVED_TO
        if libc.inotify_add_watch(fd, os.fsencode(directory), mask) < 0:
            os.close(fd)
            return None
        return fd
    except (OSError, AttributeError):  # no libc or no inotify symbols: poll instead
        return None


class CommitWatcher:
    """Calls ``callback("appended")`` from its thread when another connection
    commits new events to the SQLite outbox at ``path`` (see module docstring).
    :meth:`stop` ends the thread (idempotent)."""

    def __init__(self, path: str, callback: Callable[[str], None]) -> None:
        self._path = path
        self._wal = os.path.basename(path) + "-wal"
        self._callback = callback
        self._stopped = threading.Event()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
        self._db.execute("PRAGMA query_only=1")
        self._version = -1
        self._last = self._max_seq()
        self._fd = _inotify(os.path.dirname(os.path.abspath(path)))
        self._wake_r, self._wake_w = os.pipe()  # stop() ends a blocking select at once
        self._thread = threading.Thread(target=self._run, name="outrelay-sqlite-watch", daemon=True)
        self._thread.start()

    @property
    def uses_inotify(self) -> bool:
        return self._fd is not None

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=5)
        for fd in (self._fd, self._wake_r, self._wake_w):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._db.close()

    # -- the thread ---------------------------------------------------------------

    def _max_seq(self) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM outrelay_events").fetchone()
        return int(row[0] or 0)

    def _check(self) -> bool:
        """True if new events were committed since the last check (callback called)."""
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        if version == self._version:
            return False
        self._version = version
        last = self._max_seq()
        if last == self._last:
            return False  # our own bookkeeping, or a rollback
        self._last = last
        self._callback("appended")
        return True

    def _drain_events(self) -> bool:
        """Read pending inotify events; True if one concerned the WAL file."""
        assert self._fd is not None
        hit = False
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            pos = 0
            while pos + _EVENT.size <= len(buf):
                _wd, _mask, _cookie, length = _EVENT.unpack_from(buf, pos)
                name = buf[pos + _EVENT.size : pos + _EVENT.size + length].rstrip(b"\0")
                hit = hit or name == os.fsencode(self._wal)
                pos += _EVENT.size + length

    def _run(self) -> None:
        hot_until = 0.0
        quiet_since = time.monotonic()
        while not self._stopped.is_set():
            try:
                now = time.monotonic()
                if self._fd is not None:
                    timeout = 0.001 if now < hot_until else None  # idle: block until a write
                    ready, _, _ = select.select([self._fd, self._wake_r], [], [], timeout)
                    if self._fd in ready and self._drain_events():
                        hot_until = time.monotonic() + HOT_WINDOW
                    self._check()
                else:
                    timeout = 0.002 if now - quiet_since < 1.0 else 0.05
                    if self._stopped.wait(timeout):
                        return
                    if self._check():
                        quiet_since = time.monotonic()
            except (sqlite3.Error, OSError) as exc:  # e.g. the file was replaced: polling still covers us
                log.debug("sqlite commit watcher: %s", exc)
                if self._stopped.wait(0.5):
                    return
