"""The loop-lag monitor: catches a call that blocks the event loop, with the stack that blocked it.

Every check runs with a :class:`LoopWatch`. A heartbeat callback runs on the
check's event loop every :data:`BEAT` seconds; a watchdog thread wakes every
:data:`POLL` seconds and, while the heartbeat is late, samples the loop
thread: its scheduler state (``/proc/self/task/<tid>/stat``), the kernel
function it waits in (``wchan``) and its Python stack.

A late heartbeat is a *blocking stall* when the loop thread was asleep in the
kernel (state ``S`` or ``D``: ``time.sleep``, a synchronous socket, a lock,
``Future.result()``, a blocking file write) for most of it. A loop that is
merely busy (state ``R``: encoding a large payload, garbage collection, a
machine short of CPU) is not blocking, and a stall during which the watchdog
itself could not run (another thread held the interpreter lock) is not
counted either. A blocking stall longer than :data:`BOUND` (about ±5 ms:
the heartbeat's own granularity) fails the check with the innermost frames of
the blocked call. Stalls that are not the transport's are left out: inside
the target's own hooks (``provision``, ``cleanup``...: the harness pauses the
watch there), and where the innermost frame outside the standard library is
outrelay's own relay or this suite (``exempt``; e.g. the relay's store
threads shutting down in the end-to-end check).

Linux only (``/proc``); elsewhere the watch stays idle and reports nothing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Iterator
from pathlib import Path

__all__ = ["BOUND", "LoopWatch", "Stall"]

#: a blocking stall of the event loop longer than this (seconds) fails the check
BOUND = 0.04
BEAT = 0.01
POLL = 0.005
#: the watchdog counts itself starved (its sample proves nothing) when it wakes this late
_STARVED = 4 * POLL
_FRAMES = 6
HAVE_PROC = Path("/proc/self/task").is_dir()
_STDLIB = str(Path(sysconfig.get_paths()["stdlib"]).resolve())
_PACKAGE = Path(__file__).resolve().parent.parent
#: blocking whose innermost non-stdlib frame is here is not the transport's (the relay and the suite itself)
EXEMPT = (str(_PACKAGE / "core"), str(_PACKAGE / "conformance"))


def _stdlib(filename: str) -> bool:
    return filename.startswith(_STDLIB) and "-packages" not in filename


@dataclasses.dataclass(frozen=True)
class Stall:
    """One blocking stall: how long, what the thread waited in, and where (innermost frame first)."""

    seconds: float
    wchan: str
    frames: tuple[str, ...]

    def describe(self) -> str:
        where = " <- ".join(self.frames) if self.frames else "no Python frame sampled"
        return f"{self.seconds * 1000:.0f} ms waiting in {self.wchan or 'the kernel'} at {where}"


@dataclasses.dataclass
class _Sample:
    blocked: bool
    wchan: str
    starved: bool


class LoopWatch:
    """Start it inside the loop to watch (:meth:`start`), :meth:`stop` it before the loop ends;
    :attr:`stalls` then lists the blocking stalls over :data:`BOUND`."""

    def __init__(self, bound: float = BOUND) -> None:
        self.bound = bound
        self.stalls: list[Stall] = []
        self._paused = 0
        self._last = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._handle: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tid = 0
        self._ident = 0

    def start(self) -> None:
        """Begin watching the running loop (call from inside it)."""
        if not HAVE_PROC:
            return
        self._loop = asyncio.get_running_loop()
        self._tid, self._ident = threading.get_native_id(), threading.get_ident()
        self._beat()
        self._thread = threading.Thread(target=self._watch, name="outrelay-conformance-loopwatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching (idempotent); a stall in progress is settled first."""
        self._stop.set()
        if self._handle is not None:
            self._handle.cancel()
        if self._thread is not None:
            self._thread.join(1.0)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Ignore stalls while the block runs (the target's hooks: not the transport's code)."""
        self._paused += 1
        try:
            yield
        finally:
            self._last = time.monotonic()  # a stall that began in the hook is not the transport's either
            self._paused -= 1

    def _beat(self) -> None:
        self._last = time.monotonic()
        assert self._loop is not None
        self._handle = self._loop.call_later(BEAT, self._beat)

    def _state(self) -> tuple[bool, str]:
        """(asleep in the kernel, wchan) of the loop thread."""
        task = f"/proc/self/task/{self._tid}"
        try:
            with open(f"{task}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
            with open(f"{task}/wchan", "rb") as fh:
                wchan = fh.read().decode(errors="replace").strip()
        except (OSError, IndexError):
            return False, ""
        return state in (b"S", b"D"), "" if wchan == "0" else wchan

    def _frames(self) -> tuple[tuple[str, ...], bool]:
        """The loop thread's innermost frames, and whether the blocking is exempt (see the module docstring)."""
        frame = sys._current_frames().get(self._ident)
        if frame is None:
            return (), False
        summary = traceback.extract_stack(frame)
        culprit = next((f.filename for f in reversed(summary) if not _stdlib(f.filename)), "")
        shown = tuple(f"{Path(f.filename).name}:{f.lineno} in {f.name} ({(f.line or '').strip()[:60]})"
                      for f in reversed(summary[-_FRAMES:]))  # fmt: skip
        return shown, culprit.startswith(EXEMPT)

    def _watch(self) -> None:
        samples: list[_Sample] = []
        frames: tuple[str, ...] = ()
        exempt = False
        began = 0.0
        prev = time.monotonic()
        while not self._stop.wait(POLL):
            now = time.monotonic()
            starved, prev = now - prev > _STARVED, now
            last = self._last
            if now - last > BEAT + 2 * POLL and not self._paused:
                if not samples:
                    began = last
                blocked, wchan = self._state()
                samples.append(_Sample(blocked, wchan, starved))
                if blocked and now - began > self.bound / 2:
                    shown, exempt = self._frames()
                    frames = shown or frames
            elif samples:
                if not exempt:
                    self._settle(samples, frames, last - began - BEAT / 2)
                samples, frames, exempt = [], (), False

    def _settle(self, samples: list[_Sample], frames: tuple[str, ...], seconds: float) -> None:
        """Record the stall that just ended if it was long, and blocking (not busy, not starved)."""
        if seconds <= self.bound or len(samples) < 2 or self._paused:
            return
        blocking = [s for s in samples if s.blocked and not s.starved]
        if len(blocking) < 0.6 * len(samples):
            return
        wchan = collections.Counter(s.wchan for s in blocking).most_common(1)[0][0]
        self.stalls.append(Stall(seconds, wchan, frames))
