"""Cross-process wake-ups for the SQLite outbox: notice another process's
committed append within a few milliseconds, without busy polling.

SQLite has no LISTEN/NOTIFY. A commit in WAL mode writes its frames to the
``-wal`` file with ``write()``, then makes them visible through the shared
wal-index. :class:`CommitWatcher` runs one daemon thread:

* **Linux**: it blocks on an ``inotify`` watch of the database's directory
  (events for the ``-wal`` file only), so an idle relay costs nothing. The
  ``write()`` is seen slightly *before* the commit is visible (the fsync
  comes between), and most WAL writes are the relay's own bookkeeping
  (route, claim, settle: several per relayed event at a trickle, when
  following each with a hundred milliseconds of checks every 1-5 ms cost
  most of the relay's CPU). So after a WAL write it first asks whether
  *another process* holds SQLite's WAL write lock (``F_GETLK`` on the lock
  byte in the ``-shm`` file: a lock held by this process, the relay's own,
  is not reported), then checks once. A writer that holds the lock has not
  made its commit visible yet: the thread checks again every ``FAST_STEP``
  (1 ms) until the lock is free (after ``HOT_WINDOW``, every ``SLOW_STEP``;
  after a second, every 50 ms).
  A free lock means every write seen before it is committed or rolled back,
  so the one check sees it; the relay's own writes thus cost one check (writes
  within a millisecond of the last check share the next one). A
  check that finds the data unchanged after a write (a writer of this
  process still committing) is followed up the same way until it changes,
  for ``HOT_WINDOW`` at most.
* **Elsewhere** (or if inotify is unavailable) it polls: every 2 ms while
  appends keep coming, backing off to 50 ms after a second of quiet.

A check is ``PRAGMA data_version`` (a read of the shared wal-index header,
no table access) and, only when that moved, ``SELECT MAX(seq)`` on the
watcher's own read-only connection; so the relay's own bookkeeping writes
(route, claim, settle) never call the callback. Missed notices are harmless
(the relay still polls every ``relay.poll_interval``); one can be late only
for an appender *in the relay's process* on a connection of its own (not the
relay's :class:`~outrelay.Outbox`, which wakes the relay itself) whose write
overlaps the relay's own commit.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import fcntl
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

HOT_WINDOW = 0.1  # seconds of checks every FAST_STEP while a write is not visible yet (covers an fsync)
FAST_STEP = 0.001  # seconds between checks while another writer holds the WAL write lock
SLOW_STEP = 0.005  # seconds between checks after HOT_WINDOW (a long write transaction elsewhere)
_LONG_STEP = 0.05  # seconds between checks after a second of it
_WAL_WRITE_LOCK = 120  # byte of the -shm file SQLite's unix VFS locks for the WAL writer (UNIX_SHM_BASE + 0)
_FLOCK = "hhqqixxxx"  # struct flock on Linux: l_type, l_whence, l_start, l_len, l_pid (padded)
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


def _open_shm(path: str) -> int | None:
    """A read-only fd on the database's ``-shm`` file (for :func:`_foreign_writer`), or None."""
    try:
        return os.open(path + "-shm", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:  # not in WAL mode yet, or no shared memory file: every write is followed up
        return None


def _foreign_writer(shm: int | None) -> bool:
    """True when another process holds the WAL write lock (is writing, its commit not visible yet),
    or when that cannot be told. POSIX record locks of this process are never reported to it."""
    if shm is None:
        return True
    try:
        got = fcntl.fcntl(shm, fcntl.F_GETLK, struct.pack(_FLOCK, fcntl.F_WRLCK, os.SEEK_SET, _WAL_WRITE_LOCK, 1, 0))
    except OSError:
        return True
    return bool(struct.unpack(_FLOCK, got)[0] != fcntl.F_UNLCK)


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
        self._shm = _open_shm(path) if self._fd is not None else None
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
        for fd in (self._fd, self._shm, self._wake_r, self._wake_w):
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
        return self._look() == "appended"

    def _look(self) -> str:
        """One check: ``"appended"`` (new events committed; callback called), ``"changed"``
        (other commits, e.g. the relay's bookkeeping) or ``"same"`` (nothing committed)."""
        version = int(self._db.execute("PRAGMA data_version").fetchone()[0])
        if version == self._version:
            return "same"
        self._version = version
        last = self._max_seq()
        if last == self._last:
            return "changed"  # our own bookkeeping, or a rollback
        self._last = last
        self._callback("appended")
        return "appended"

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
        """The Linux loop (see the module docstring): block until a WAL write; then ask whether
        another process is still writing, and check. Follow up every ``FAST_STEP`` (``SLOW_STEP``
        after ``HOT_WINDOW``) while a writer is not done: another process holds the WAL write lock,
        or nothing became visible after a write (a writer of this process); else block again.
        Writes that come meanwhile are read all at once (one inotify event per page written)."""
        assert self._fd is not None
        pending_since: float | None = None  # when the writer being waited for was first seen
        unseen = False  # a write was seen, and no commit since
        checked = 0.0  # when the last check ran
        while not self._stopped.is_set():
            try:
                if pending_since is None:
                    select.select([self._fd, self._wake_r], [], [])
                    rest = FAST_STEP - (time.monotonic() - checked)
                    if rest > 0:  # writes within a millisecond of the last check: one check for them all
                        select.select([self._wake_r], [], [], rest)
                else:
                    waited = time.monotonic() - pending_since
                    step = FAST_STEP if waited < HOT_WINDOW else SLOW_STEP if waited < 1.0 else _LONG_STEP
                    select.select([self._wake_r], [], [], step)
                wrote = self._drain_events()
                if not wrote and pending_since is None:
                    continue
                unseen = unseen or wrote
                if self._shm is None:
                    self._shm = _open_shm(self._path)
                writing = _foreign_writer(self._shm)  # first: a lock free now means every write seen is done
                seen = self._look()
                checked = time.monotonic()
                if seen != "same":
                    unseen = False
                now = time.monotonic()
                if not (writing or unseen):
                    pending_since = None
                elif pending_since is None or seen != "same":  # waiting starts, or commits go on
                    pending_since = now
                elif unseen and now - pending_since >= HOT_WINDOW:
                    unseen = False  # a write of this process that never committed (rolled back)
            except (sqlite3.Error, OSError) as exc:  # e.g. the file was replaced: polling still covers us
                log.debug("sqlite commit watcher: %s", exc)
                if self._stopped.wait(0.5):
                    return
