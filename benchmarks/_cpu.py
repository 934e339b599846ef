"""Process CPU time per event for the bench_subscribe_* scripts.

``time.process_time`` counts this process only (the broker's CPU is not in
it) and hardly moves when other work shares the machine, unlike ev/s: on a
loaded machine compare these figures, not the throughput ratios.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["CpuClock"]

T = TypeVar("T")


class CpuClock:
    """Sums the process CPU seconds of named phases over ``count`` events each."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.seconds: dict[str, list[float]] = {}

    async def time(self, name: str, work: Awaitable[T]) -> T:
        """Await ``work`` and add its CPU time to phase ``name``."""
        started = time.process_time()
        try:
            return await work
        finally:
            self.seconds.setdefault(name, []).append(time.process_time() - started)

    def per_event(self, name: str) -> float:
        """Mean CPU µs per event of phase ``name`` over its runs."""
        runs = self.seconds[name]
        return sum(runs) / len(runs) / self.count * 1e6

    def report(self) -> str:
        """One line: µs/event per phase, then raw/phase (1.0 = as lean as the raw loop)."""
        raw = self.per_event("raw")
        parts = [f"{name} {self.per_event(name):.1f} µs" for name in self.seconds]
        ratios = [f"{name} {raw / self.per_event(name):.2f}" for name in self.seconds if name != "raw"]
        return ", ".join(parts) + " (cpu raw/x: " + ", ".join(ratios) + ")"
