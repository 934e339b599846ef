"""The relay/raw ratio of the broker benchmarks.

The raw client is timed twice, before and after the relay, on a fresh
topic/stream/key each time: brokers drift within a run (file storage,
caches, the machine), and one raw figure alone moved ±15% between runs.
The ratio divides the relay's events/s by the mean of the two raw figures.
"""

from __future__ import annotations

__all__ = ["ratio", "raw_line"]


def raw_line(n: int, before: float, after: float) -> str:
    """``events/s`` of both raw runs and their mean (durations in seconds)."""
    mean = (n / before + n / after) / 2
    return f"{mean:10.0f} ev/s (mean of {n / before:,.0f} before and {n / after:,.0f} after the relay)"


def ratio(n: int, relay: float, before: float, after: float) -> float:
    """Relay events/s over the mean raw events/s."""
    return (n / relay) / ((n / before + n / after) / 2)
