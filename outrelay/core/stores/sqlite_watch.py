"""Cross-process wake-ups for the SQLite outbox: notice another process's
committed append within a few milliseconds, without busy polling.

SQLite has no LISTEN/NOTIFY. A commit in WAL mode writes its frames to the
``-wal`` file with ``write()``, then makes them visible through the shared
wal-index. :class:`CommitWatcher` watches in the caller's event loop when
given one and inotify is available (the relay does: no thread of its own, no
hand-off to call back), else in one daemon thread:

* **Linux**: it waits on an ``inotify`` watch of the database's directory
  (events for the ``-wal`` file only; a reader of the loop, or a blocking
  ``select`` in the thread), so an idle relay costs nothing. The
  ``write()`` is seen slightly *before* the commit is visible (the fsync
  comes between), and most WAL writes are the relay's own bookkeeping
  (route, claim, settle: several per relayed event at a trickle, when
  following each with a hundred milliseconds of checks every 1-5 ms cost
  most of the relay's CPU). So after a WAL write it first asks whether
  *another process* holds SQLite's WAL write lock (``F_GETLK`` on the lock
  byte in the ``-shm`` file: a lock held by this process, the relay's own,
  is not reported), then checks once. A writer that holds the lock has not
  made its commit visible yet: the watcher checks again every ``FAST_STEP``
  (1 ms) until the lock is free (after ``HOT_WINDOW``, every ``SLOW_STEP``;
  after a second, every 50 ms).
  A free lock means every write seen before it is committed or rolled back,
  so the one check sees it; the relay's own writes made in another thread
  thus cost one check (writes within a millisecond of the last check share
  the next one). A
  check that finds the data unchanged after a write (a writer of this
  process still committing) is followed up the same way until it changes,
  for ``HOT_WINDOW`` at most.
  In the loop, the store's own transactions run there too (the relay's calls at
  a trickle, see ``SQLiteStore.call_inline``) and tell the watcher: the events
  read right after their ``BEGIN IMMEDIATE`` (the lock held) are other writers'
  finished writes, and those read right after their ``COMMIT`` are their own,
  unless another process holds the lock by then or a commit since moved the
  store connection's ``data_version``. So the relay's own bookkeeping costs no
  round at all (``own_tx_begun``, ``own_tx_committed``).
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

import asyncio
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

__all__ = ["CommitWatcher", "data_version"]

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


def data_version(db: sqlite3.Connection) -> int:
    """``PRAGMA data_version`` of ``db``: moves when another connection commits, never for ``db``'s own."""
    return int(db.execute("PRAGMA data_version").fetchone()[0])


class CommitWatcher:
    """Calls ``callback("appended")`` when another connection commits new events to the SQLite
    outbox at ``path`` (see the module docstring). With ``loop`` (and inotify), the watch runs in
    that event loop and the callback is called there; else a daemon thread runs it and calls the
    callback from that thread. :meth:`stop` ends it (idempotent; with ``loop``, call it in the
    loop's thread)."""

    def __init__(
        self, path: str, callback: Callable[[str], None], loop: asyncio.AbstractEventLoop | None = None
    ) -> None:
        self._path = path
        self._wal = os.path.basename(path) + "-wal"
        self._wal_name = os.fsencode(self._wal) + b"\0"  # as it ends in an event: NUL-padded
        self._callback = callback
        self._stopped = threading.Event()
        self._db = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=5.0)
        self._db.execute("PRAGMA query_only=1")
        # the baseline of the checks, version first: a commit between the two reads is then taken for
        # one without new events, never hidden (a stale -1 made the first check after a write of this
        # process, caught before its commit was visible, end the wait for it: "changed", no new events)
        self._version = data_version(self._db)
        self._last = self._max_seq()
        self._fd = _inotify(os.path.dirname(os.path.abspath(path)))
        self._shm = _open_shm(path) if self._fd is not None else None
        self._pending_since: float | None = None  # when the writer being waited for was first seen
        self._unseen = False  # a write was seen, and no commit since
        self._checked = 0.0  # when the last check ran
        self._loop = loop if self._fd is not None else None
        self._timer: asyncio.TimerHandle | None = None
        self._thread: threading.Thread | None = None
        self._wake_r = self._wake_w = -1
        self._watching = False  # the loop watches the inotify fd
        self._forced = False  # a round must check even if it reads no inotify event
        self._loop_thread = threading.get_ident() if self._loop is not None else -1
        if self._loop is not None:
            # a check in the loop waits at most 10 ms for a lock (SQLITE_BUSY, rare for a WAL reader)
            self._db.execute("PRAGMA busy_timeout = 10")
            self._loop.add_reader(self._fd, self._readable)  # type: ignore[arg-type]
            self._watching = True
            return
        self._wake_r, self._wake_w = os.pipe()  # stop() ends a blocking select at once
        self._thread = threading.Thread(target=self._run, name="outrelay-sqlite-watch", daemon=True)
        self._thread.start()

    @property
    def uses_inotify(self) -> bool:
        return self._fd is not None

    @property
    def in_loop(self) -> bool:
        """Whether the watch runs in the caller's event loop (no thread of its own)."""
        return self._loop is not None

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        if self._loop is not None:
            if self._timer is not None:
                self._timer.cancel()
            if not self._loop.is_closed():
                self._unwatch()
        else:
            os.write(self._wake_w, b"x")
            assert self._thread is not None
            self._thread.join(timeout=5)
        for fd in (self._fd, self._shm, self._wake_r, self._wake_w):
            if fd is not None and fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._db.close()

    # -- the checks -----------------------------------------------------------------

    def _max_seq(self) -> int:
        row = self._db.execute("SELECT MAX(seq) FROM outrelay_events").fetchone()
        return int(row[0] or 0)

    def _check(self) -> bool:
        """True if new events were committed since the last check (callback called)."""
        return self._look() == "appended"

    def _look(self) -> str:
        """One check: ``"appended"`` (new events committed; callback called), ``"changed"``
        (other commits, e.g. the relay's bookkeeping) or ``"same"`` (nothing committed)."""
        version = data_version(self._db)
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

    def _rest(self) -> float:
        """Seconds to wait after a wake-up before the round: writes within ``FAST_STEP`` of the
        last check share the next one."""
        return FAST_STEP - (time.monotonic() - self._checked)

    def _round(self) -> float | None:
        """One round after a wake-up (see the module docstring): read the inotify events; when one
        concerns the WAL, or a writer is being waited for, ask whether another process is still
        writing, and check. Returns None to wait for the next write, or the seconds until the next
        round (``FAST_STEP``, ``SLOW_STEP`` after ``HOT_WINDOW``) while a writer is not done:
        another process holds the WAL write lock, or nothing became visible after a write (a
        writer of this process)."""
        wrote = self._drain_events() or self._forced
        self._forced = False
        if not wrote and self._pending_since is None:
            return None
        self._unseen = self._unseen or wrote
        writing = self._foreign_writer()  # first: a lock free now means every write seen is done
        seen = self._look()
        now = self._checked = time.monotonic()
        if seen != "same":
            self._unseen = False
        if not (writing or self._unseen):
            self._pending_since = None
            return None
        if self._pending_since is None or seen != "same":  # waiting starts, or commits go on
            self._pending_since = now
        elif self._unseen and now - self._pending_since >= HOT_WINDOW:
            self._unseen = False  # a write of this process that never committed (rolled back)
        waited = now - self._pending_since
        return FAST_STEP if waited < HOT_WINDOW else SLOW_STEP if waited < 1.0 else _LONG_STEP

    def _foreign_writer(self) -> bool:
        """:func:`_foreign_writer` on the ``-shm`` file, opened first where it was missing (not in WAL
        mode yet when the watch began)."""
        if self._shm is None:
            self._shm = _open_shm(self._path)
        return _foreign_writer(self._shm)

    def owns_thread(self) -> bool:
        """Whether the caller runs in the loop the watch runs in."""
        return self._loop is not None and threading.get_ident() == self._loop_thread

    def own_tx_begun(self) -> None:
        """Called (in the loop's thread) right after a write transaction of the watched store's own began,
        holding the WAL write lock: the inotify events read now are other writers' finished writes."""
        if self._stopped.is_set():
            return
        try:
            if self._drain_events():
                self._force()
        except OSError:
            self._force()

    def own_tx_committed(self, version_before: int, db: sqlite3.Connection) -> None:
        """Called (in the loop's thread) right after that transaction committed: the events read now are
        its own writes, and those of another writer that took the lock since — which still holds it, or
        whose commit moved the :func:`data_version` of the store's connection ``db`` (``version_before``:
        read in the transaction; a connection's own commits never move it). Never raises (the
        transaction is committed): on an error, the next round checks."""
        if self._stopped.is_set():
            return
        try:
            if not self._drain_events():
                return
            # first: the watcher's own baseline, which this commit moved (a later check would take that
            # move for another writer's); a foreign commit after this read is still seen by the next check
            mine = data_version(self._db)
            if self._foreign_writer() or data_version(db) != version_before:
                self._force()
            elif not (self._forced or self._timer is not None or self._pending_since is not None):
                self._version = mine  # else a round is due: it checks against the old baseline, MAX(seq) included
        except (OSError, sqlite3.Error):
            self._force()

    def _force(self) -> None:
        assert self._loop is not None
        self._forced = True
        if self._timer is None:
            self._timer = self._loop.call_later(0, self._loop_round)

    # -- in the event loop -----------------------------------------------------------

    def _readable(self) -> None:
        """The loop saw a write: one round now, or after the rest of ``FAST_STEP`` (the inotify fd is
        not watched meanwhile: its events queue up and are read by the round) — after all of it when
        another process holds the WAL write lock: its commit is not visible yet (an appender's fsync
        comes between its write and its commit), so a round now would only find that out."""
        assert self._loop is not None
        rest = self._rest()
        if rest <= 0 and self._foreign_writer():
            rest = FAST_STEP
        if rest > 0:
            self._unwatch()
            self._timer = self._loop.call_later(rest, self._loop_round)
        else:
            self._loop_round()

    def _loop_round(self) -> None:
        """One round (:meth:`_round`), then watch the fd again, or come back when the round asks."""
        assert self._loop is not None
        self._timer = None
        if self._stopped.is_set():
            return
        try:
            wait = self._round()
        except (sqlite3.Error, OSError) as exc:  # e.g. busy, or the file was replaced: polling still covers us
            log.debug("sqlite commit watcher: %s", exc)
            wait = _LONG_STEP
        if wait is None:
            if not self._watching:  # most rounds end here with the fd still watched: no epoll_ctl
                self._loop.add_reader(self._fd, self._readable)  # type: ignore[arg-type]
                self._watching = True
        else:
            self._unwatch()
            self._timer = self._loop.call_later(wait, self._loop_round)

    def _unwatch(self) -> None:
        assert self._loop is not None
        if self._watching:
            self._loop.remove_reader(self._fd)  # type: ignore[arg-type]
            self._watching = False

    # -- in a thread -------------------------------------------------------------------

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
        """The Linux loop of the thread: block until a WAL write, then run rounds (:meth:`_round`)
        as long as it asks; writes that come meanwhile are read all at once (one inotify event per
        page written)."""
        assert self._fd is not None
        wait: float | None = None
        while not self._stopped.is_set():
            try:
                if wait is None:
                    select.select([self._fd, self._wake_r], [], [])
                    rest = self._rest()
                    if rest > 0:  # writes within a millisecond of the last check: one check for them all
                        select.select([self._wake_r], [], [], rest)
                else:
                    select.select([self._wake_r], [], [], wait)
                if self._stopped.is_set():
                    return
                wait = self._round()
            except (sqlite3.Error, OSError) as exc:  # e.g. the file was replaced: polling still covers us
                log.debug("sqlite commit watcher: %s", exc)
                wait = None
                if self._stopped.wait(0.5):
                    return
