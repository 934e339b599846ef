"""Cross-process wake-ups for the SQLite outbox: notice another process's
committed append within a few milliseconds, without busy polling.

SQLite has no LISTEN/NOTIFY. A commit in WAL mode writes its frames to the
``-wal`` file with ``write()``, then makes them visible through the shared
wal-index. :class:`CommitWatcher` runs one daemon thread:

* **Linux**: it blocks on an ``inotify`` watch of the database's directory
  (events for the ``-wal`` file only), so an idle relay costs nothing. The
  ``write()`` is seen slightly *before* the commit is visible (the fsync
  comes between), so after each event the thread keeps checking for
  ``HOT_WINDOW`` seconds; a check that finds a new last event ``seq`` calls
  the callback. It checks every ``FAST_STEP`` (1 ms) while that pays: after
  the first WAL write following ``QUIET`` seconds without one (an append,
  most likely) and for ``HOT_WINDOW`` after a check that found new events.
  Otherwise — the WAL writes are the relay's own bookkeeping, as during a
  drain, when a 1 ms cadence meant two thousand checks a second and 12% of a
  core (about 12 µs of CPU per relayed event) for nothing — every
  ``SLOW_STEP`` (5 ms), so an append is still seen within that.
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

HOT_WINDOW = 0.1  # seconds of checks after a WAL write (covers the commit's fsync)
FAST_STEP = 0.001  # seconds between checks while they find appends (or after a quiet spell)
SLOW_STEP = 0.005  # seconds between checks while the WAL writes add no events (the relay's bookkeeping)
QUIET = 0.05  # seconds without a WAL write after which the next one is taken for an append
_IN_MODIFY, _IN_CREATE, _IN_MOVED_TO = 0x2, 0x100, 0x80
_OVERFLOW_WD = struct.pack("i", -1)  # the watch descriptor of IN_Q_OVERFLOW events
_IN_NONBLOCK, _IN_CLOEXEC = 0o4000, 0o2000000


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
        self._wal_name = os.fsencode(self._wal) + b"\0"  # as it ends in an event: NUL-padded
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
        """Read pending inotify events; True if one may concern the WAL file.

        A relay's own writes make thousands of events a second (one per page written), so
        the buffers are searched, not parsed: the WAL file's name anywhere in them (a file
        whose name contains it gives a needless check, nothing worse), or an overflow
        event (its watch descriptor is -1: events were lost, so assume a write)."""
        assert self._fd is not None
        hit = False
        while True:
            try:
                buf = os.read(self._fd, 65536)
            except BlockingIOError:
                return hit
            hit = hit or self._wal_name in buf or _OVERFLOW_WD in buf

    def _run(self) -> None:
        if self._fd is not None:
            self._run_inotify()
            return
        quiet_since = time.monotonic()
        while not self._stopped.is_set():
            try:
                timeout = 0.002 if time.monotonic() - quiet_since < 1.0 else 0.05
                if self._stopped.wait(timeout):
                    return
                if self._check():
                    quiet_since = time.monotonic()
            except (sqlite3.Error, OSError) as exc:  # e.g. the file was replaced: polling still covers us
                log.debug("sqlite commit watcher: %s", exc)
                if self._stopped.wait(0.5):
                    return

    def _run_inotify(self) -> None:
        """The Linux loop (see the module docstring): block until a WAL write, then, until
        ``HOT_WINDOW`` after the last one, sleep to the next check at the fast or slow cadence
        and read the writes that came meanwhile all at once (a relay's own bookkeeping writes
        one inotify event per page: waking for each cost more than the checks)."""
        assert self._fd is not None
        hot_until = fast_until = last_write = 0.0
        due: float | None = None  # when the next check is due; None: block until a write
        while not self._stopped.is_set():
            try:
                if due is None:
                    select.select([self._fd, self._wake_r], [], [])
                else:
                    select.select([self._wake_r], [], [], max(0.0, due - time.monotonic()))
                now = time.monotonic()
                if self._drain_events():
                    if now - last_write >= QUIET:  # the first write after a quiet spell: an append, most likely
                        fast_until = now + HOT_WINDOW
                    last_write, hot_until = now, now + HOT_WINDOW
                if self._check():
                    fast_until = now + HOT_WINDOW
                due = now + (FAST_STEP if now < fast_until else SLOW_STEP) if now < hot_until else None
            except (sqlite3.Error, OSError) as exc:  # e.g. the file was replaced: polling still covers us
                log.debug("sqlite commit watcher: %s", exc)
                if self._stopped.wait(0.5):
                    return
