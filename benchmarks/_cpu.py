"""Process CPU time per event for the bench_subscribe_* scripts, and other processes' CPU from /proc.

``time.process_time`` counts this process only (the broker's CPU is not in
it) and hardly moves when other work shares the machine, unlike ev/s: on a
loaded machine compare these figures, not the throughput ratios.
:func:`stat_cpu` reads another process's CPU seconds (Linux ``/proc``), :func:`backends_cpu`
those of the PostgreSQL backends serving connections of a given ``application_name``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable
from typing import TypeVar

__all__ = ["CpuClock", "backends_cpu", "stat_cpu"]

T = TypeVar("T")


def stat_cpu(pid: int | str, *, children: bool = False) -> tuple[str, float]:
    """(command name, CPU seconds) of process ``pid`` from ``/proc/PID/stat``: user + system
    time, plus that of its waited-for children with ``children`` (where an exited PostgreSQL
    backend's time goes).

    :raises OSError: no such process, or no ``/proc``.
    """
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
    ticks = sum(int(x) for x in rest[11 : 15 if children else 13])  # utime, stime[, cutime, cstime]
    return name, ticks / os.sysconf("SC_CLK_TCK")


def backends_cpu(admin_url: str, application_name: str) -> float:
    """CPU seconds so far of the PostgreSQL server processes (on this host) serving the connections
    named ``application_name`` (``pg_stat_activity``; read before those connections close).

    :raises OSError: no ``/proc``. :raises psycopg.Error: cannot connect with ``admin_url``."""
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        sql = "SELECT pid FROM pg_stat_activity WHERE application_name = %s"
        pids = [r[0] for r in conn.execute(sql, (application_name,))]
    total = 0.0
    for pid in pids:
        try:
            total += stat_cpu(pid)[1]
        except FileNotFoundError:  # gone meanwhile
            continue
    return total


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
