"""Where a hanging test waits: its asyncio tasks' stacks, printed shortly before pytest-timeout ends the run.

pytest-timeout (``timeout`` in pyproject.toml, thread method) stops a test that runs too long: it prints
every thread's stack and exits, so one hang costs minutes, not the CI's whole budget. For an asyncio test
those stacks show little: the main thread sits in the event loop's ``select``, and the await that never
returns is in a task. This plugin prints the pending tasks' stacks ``EARLY`` seconds before that timeout,
to the real stderr (not captured). It only reads; a test that finishes in time never triggers it.
"""

from __future__ import annotations

import asyncio
import io
import sys
import threading
from typing import Any

import pytest

EARLY = 20.0  # seconds before pytest-timeout's limit


def _pending_tasks() -> list[asyncio.Task[object]]:
    """Every pending task of every loop (read from another thread: retried if the set changes meanwhile)."""
    tasks = getattr(asyncio.tasks, "_all_tasks", None)  # the WeakSet asyncio registers each task in
    if tasks is None:
        return []
    for _ in range(5):
        try:
            return [t for t in list(tasks) if not t.done()]
        except RuntimeError:  # the set changed during the copy
            continue
    return []


def _report(nodeid: str, after: float) -> None:
    out = sys.__stderr__
    if out is None:
        return
    lines = [f"\n=== {nodeid} is still running after {after:.0f} s; its pending asyncio tasks: ==="]
    for task in _pending_tasks():
        buf = io.StringIO()
        try:
            task.print_stack(limit=40, file=buf)
        except Exception as exc:  # a frame that changed under us: say so and go on
            buf.write(f"(stack unreadable: {exc!r})\n")
        lines.append(f"--- {task.get_name()}: {task.get_coro()!r}\n{buf.getvalue()}")
    print("\n".join(lines), file=out, flush=True)


_TIMER = pytest.StashKey[threading.Timer]()


@pytest.hookimpl(tryfirst=True)  # before pytest-timeout's own, which returns True and ends the call
def pytest_timeout_set_timer(item: pytest.Item, settings: Any) -> None:
    """pytest-timeout arms its timer with the limit it resolved (ini, ``--timeout``, a ``timeout``
    marker): arm the report ``EARLY`` s before it. Returns None, so pytest-timeout's own timer is armed too."""
    if settings.timeout > EARLY:
        after = settings.timeout - EARLY
        timer = item.stash[_TIMER] = threading.Timer(after, _report, args=(item.nodeid, after))
        timer.daemon = True
        timer.start()


@pytest.hookimpl(tryfirst=True)
def pytest_timeout_cancel_timer(item: pytest.Item) -> None:
    """The test ended in time: no report (returns None, so pytest-timeout cancels its own timer too)."""
    timer = item.stash.get(_TIMER, None)
    if timer is not None:
        timer.cancel()
        del item.stash[_TIMER]
