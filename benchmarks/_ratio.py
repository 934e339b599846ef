"""The relay/raw ratio of the broker benchmarks.

The raw client is timed twice, before and after the relay, on a fresh
topic/stream/key each time: brokers drift within a run (file storage,
caches, the machine), and one raw figure alone moved ±15% between runs.
The ratio divides the relay's events/s by the mean of the two raw figures.

Next to it the benchmarks print the CPU per event of this process (every
thread: the relay's store threads and the clients' own tasks included) in
each timed window, recorded with :func:`record_cpu`: on a shared machine it
moves far less than events/s. ``relay`` is the relay into the broker,
``raw`` the raw client, ``ceiling`` the relay into the in-process memory
transport (the engine's own cost per event at a drain).
"""

from __future__ import annotations

import time
from collections import defaultdict

__all__ = ["CPU", "cpu_line", "ratio", "raw_line", "record_cpu"]

#: CPU seconds of this process in each timed window, by window name
CPU: dict[str, list[float]] = defaultdict(list)
_LABELS = {"relay": "relay", "raw": "raw client", "ceiling": "engine ceiling (relay -> memory)"}


def record_cpu(name: str, since: float) -> None:
    """Record the CPU this process spent since ``since`` (a ``time.process_time()``) as window ``name``."""
    CPU[name].append(time.process_time() - since)


def cpu_line(n: int) -> str:
    """CPU µs per event of each window recorded (mean over its runs of ``n`` events)."""
    parts = [f"{label} {sum(CPU[k]) / len(CPU[k]) / n * 1e6:.1f} µs" for k, label in _LABELS.items() if CPU.get(k)]
    return "CPU per event (this process, every thread): " + ", ".join(parts)


def raw_line(n: int, before: float, after: float) -> str:
    """``events/s`` of both raw runs and their mean (durations in seconds)."""
    mean = (n / before + n / after) / 2
    return f"{mean:10.0f} ev/s (mean of {n / before:,.0f} before and {n / after:,.0f} after the relay)"


def ratio(n: int, relay: float, before: float, after: float) -> float:
    """Relay events/s over the mean raw events/s."""
    return (n / relay) / ((n / before + n / after) / 2)
