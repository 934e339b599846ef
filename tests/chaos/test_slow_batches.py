"""A lane slower than ``attempt_timeout`` still progresses (a liveness gap the chaos runs found).

``DestinationWorker._send`` cancels a batch's ``transport.send`` at
``attempt_timeout`` and settles every message of it as RetryLater (a
cancelled transport cannot report partial results). Transports send a
stream's events one after another, so a lane of ``per_stream`` events needs
``per_stream`` round trips: when that exceeded the deadline, each attempt
re-sent the same head of the lane and timed out again, for ever. The worker
now halves its events per stream per batch after a timed-out attempt (and
grows them back by one per batch delivered in time), so the lane shrinks
until an attempt fits the deadline.
"""

from __future__ import annotations

from pathlib import Path

from tests.chaos._harness import Rig, run_chaos


async def test_a_lane_slower_than_the_attempt_deadline_still_progresses(tmp_path: Path, webhook_rig: Rig) -> None:
    """One stream behind 100 ms of latency each way, 20 events per lane (≥ 4 s a lane) and a 2 s attempt
    deadline: the relay shrinks the lane and delivers all 30 events (about 11 s; 30 s allowed)."""
    webhook_rig.options |= {"per_stream": 20, "attempt_timeout": 2.0, "timeout": 10.0}
    webhook_rig.proxy.latency = 0.1
    outcome = await run_chaos(tmp_path, webhook_rig, [], events=30, streams=1, limit=30)
    outcome.check()
