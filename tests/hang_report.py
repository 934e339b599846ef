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
from collections.abc import Iterator

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    limit = float(item.config.getini("timeout") or 0)
    marker = item.get_closest_marker("timeout")
    if marker is not None and marker.args:
        limit = float(marker.args[0])
    timer = None
    if limit > EARLY:
        timer = threading.Timer(limit - EARLY, _report, args=(item.nodeid, limit - EARLY))
        timer.daemon = True
        timer.start()
    try:
        yield
    finally:
        if timer is not None:
            timer.cancel()
