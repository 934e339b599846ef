"""Replay benchmark: decode + upcast + apply throughput of one stream, on one core.

::

    python benchmarks/bench_replay.py [--store sqlite|postgres|both] [--count 1000000]
        [--postgres postgresql://postgres@127.0.0.1:5432/test]

Appends ``--count`` events of ~200 B of JSON data to one stream (90 % at the
current event_version 2, 10 % at version 1 so the v1 → v2 upcaster runs),
then times :func:`outrelay.core.history.replay.rebuild` of a small workflow
projection over the whole stream: reading pages, decoding every event,
upcasting and applying — twice with full :class:`~outrelay.Event` s, twice
with a ``lean`` projection (:class:`~outrelay.core.history.lean.LeanEvent`). Prints events/s (wall clock) and
this process's CPU time per event (``time.process_time``: steadier than the
wall clock on a shared machine, but on PostgreSQL it leaves out the server's
work), the process's resident memory
before and after the fold and its peak, and the snapshot speed-up: a
rebuild from a snapshot (taken at the end, then 1,000 more events appended)
against a full replay. PostgreSQL runs in a schema of its own, dropped
afterwards; SQLite in a temporary file.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from outrelay import Event
from outrelay.core.history.replay import Projection, rebuild
from outrelay.core.history.upcasting import Upcasters
from outrelay.core.stores.base import Store

STREAM = "wf-bench-1"
PAD = "x" * 120  # brings each event's data to ~200 B of JSON


class Workflow(Projection[dict[str, Any]]):
    name = "bench-workflow"

    def initial(self) -> dict[str, Any]:
        return {"status": "new", "steps": 0, "retries": 0, "last": None}

    def apply(self, state: dict[str, Any], event: Event) -> dict[str, Any]:
        data = event.json()
        state["steps"] += 1
        state["retries"] += data["retries"]
        state["last"] = data["step"]
        state["status"] = data["status"]
        return state


class LeanWorkflow(Workflow):
    lean = True  # apply() gets LeanEvents: the same fields it reads, without the envelope


def upcasters() -> Upcasters:
    up = Upcasters()
    up.register("wf.step", "1", lambda d: {**d, "retries": 0})  # v1 had no retry counter
    return up


def fill(store: Store, count: int, start: int = 0) -> None:
    now = datetime.now(UTC)
    batch: list[Event] = []
    for i in range(start, start + count):
        v1 = i % 10 == 0
        data = {"step": f"step-{i}", "status": "running", "pad": PAD}
        if not v1:
            data["retries"] = i % 3
        batch.append(Event(type="wf.step", stream=STREAM, data=data, time=now, event_version="1" if v1 else "2"))
        if len(batch) == 10_000:
            store.append(batch)
            batch = []
    if batch:
        store.append(batch)


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def fill_elsewhere(url: str, count: int) -> None:
    """Append in a child process, so this one's memory figures are the fold's alone."""
    t = time.perf_counter()
    subprocess.run([sys.executable, __file__, "--fill", url, "--count", str(count)], check=True)
    print(f"appended {count:,} events in {time.perf_counter() - t:.1f}s (child process)")


def run(store: Store, label: str, count: int) -> None:
    fill_elsewhere(store.url, count)
    up, proj = upcasters(), Workflow()
    before = rss_mb()
    states = []
    for kind, p in (("Event", proj), ("Event", proj), ("LeanEvent", LeanWorkflow()), ("LeanEvent", LeanWorkflow())):
        t, cpu = time.perf_counter(), time.process_time()  # the first of each pair also warms database caches
        full = rebuild(store, p, STREAM, use_snapshot=False, upcasters=up)
        elapsed, cpu = time.perf_counter() - t, time.process_time() - cpu
        assert full.events == count and full.state["steps"] == count
        states.append(full.state)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{label}: full replay as {kind} {count:,} events in {elapsed:.2f}s = {count / elapsed:,.0f} events/s "
            f"(decode + upcast + apply, one thread), {cpu / count * 1e6:.2f} µs CPU/event in this process; "
            f"RSS {before:.0f} -> {rss_mb():.0f} MB, peak {peak:.0f} MB"
        )
    assert all(st == states[0] for st in states)
    rebuild(store, proj, STREAM, use_snapshot=False, snapshot_every=count, upcasters=up)
    fill(store, 1000, start=count)
    t = time.perf_counter()
    warm = rebuild(store, proj, STREAM, upcasters=up)
    warm_s = time.perf_counter() - t
    t = time.perf_counter()
    cold = rebuild(store, proj, STREAM, use_snapshot=False, upcasters=up)
    cold_s = time.perf_counter() - t
    assert warm.state == cold.state and warm.events == 1000
    print(
        f"{label}: after {count:,}+1,000 events, rebuild from snapshot {warm_s * 1000:.1f} ms vs full replay "
        f"{cold_s:.2f}s: {cold_s / warm_s:,.0f}x faster, same state"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--store", choices=["sqlite", "postgres", "both"], default="both")
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--postgres", default="postgresql://postgres@127.0.0.1:5432/test")
    ap.add_argument("--fill", metavar="URL", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.fill:
        from outrelay.core.stores.outbox import open_store

        target = open_store(args.fill)
        fill(target, args.count)
        target.close()
        return
    if args.store in ("sqlite", "both"):
        from outrelay.core.stores.sqlite import SQLiteStore

        with tempfile.TemporaryDirectory() as tmp:
            store = SQLiteStore(f"sqlite:///{tmp}/replay.db", synchronous="OFF")
            try:
                run(store, "sqlite", args.count)
            finally:
                store.close()
    if args.store in ("postgres", "both"):
        import psycopg

        from outrelay.core.stores.postgres import PostgresStore

        schema = f"bench_replay_{uuid.uuid4().hex[:8]}"
        sep = "&" if "?" in args.postgres else "?"
        pg = PostgresStore(f"{args.postgres}{sep}schema={schema}")
        try:
            run(pg, "postgres", args.count)
        finally:
            pg.close()
            with psycopg.connect(args.postgres, autocommit=True) as conn:
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
