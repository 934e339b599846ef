"""Commit -> broker latency with the relay in its own process, and its idle CPU.

    .venv/bin/python benchmarks/bench_latency.py [--rate 1000] [--seconds 10] [--idle 30] [--linger 0.004]
    .venv/bin/python benchmarks/bench_latency.py --outbox postgresql://127.0.0.1/test --rate 0

An ``outrelay run`` subprocess relays from the outbox (a fresh SQLite file, or
a fresh schema of ``--outbox postgresql://...``) to the machine's Redis
(``OUTRELAY_REDIS_URL``, default redis://127.0.0.1:6379/0, a fresh key,
deleted afterwards). This process appends one event per transaction at
``--rate`` events/s (0: as fast as one appender goes) and records the time
each ``append`` returned (the commit); a thread reads the key back with
``XREAD BLOCK`` and records each arrival. Prints p50/p90/p99/max of arrival -
commit and the relay's CPU (share of one core, and per event) while it relayed
them, then its CPU
seconds over ``--idle`` seconds with nothing to do (from /proc/PID/stat).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import redis
from _checkout import RELAY_ENV, ROOT
from _cpu import stat_cpu

from outrelay import Event, Outbox

REDIS_URL = os.environ.get("OUTRELAY_REDIS_URL", "redis://127.0.0.1:6379/0")


def cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` (Linux /proc)."""
    return stat_cpu(pid)[1]


def reader(client: redis.Redis, key: str, arrivals: dict[str, float], want: int, stop: threading.Event) -> None:
    last = "0-0"
    while len(arrivals) < want and not stop.is_set():
        for _key, entries in client.xread({key: last}, block=200, count=1000) or []:
            now = time.time()
            for entry_id, fields in entries:
                last = entry_id
                arrivals.setdefault(fields[b"ce_id"].decode(), now)


def percentile(values: list[float], p: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * p))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=1000.0, help="appends per second (0: as fast as possible)")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--idle", type=float, default=30.0, help="seconds of idle relay CPU measurement (0: skip)")
    ap.add_argument("--outbox", default="", help="postgresql://... (default: a fresh SQLite file)")
    ap.add_argument("--linger", type=float, default=None, help="the relay's relay.linger in seconds (default: its own)")
    args = ap.parse_args()

    key = f"outrelay-bench:latency:{uuid.uuid4().hex[:8]}"
    client = redis.Redis.from_url(REDIS_URL)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        url = args.outbox + ("&" if "?" in args.outbox else "?") + f"schema={schema}" if args.outbox else ""
        url = url or f"sqlite:///{tmp}/outbox.db"
        cfg = Path(tmp, "outrelay.toml")
        relay = "" if args.linger is None else f"[relay]\nlinger = {args.linger}\n"
        cfg.write_text(
            f'[outbox]\nurl = "{url}"\n{relay}[destinations.r]\ntransport = "redis"\nurl = "{REDIS_URL}"\n'
            f'stream = "{key}"\n'
        )
        outbox = Outbox.open(url)
        proc = subprocess.Popen(
            [sys.executable, "-m", "outrelay", "run", "-c", str(cfg), "--log-level", "warning"],
            stderr=subprocess.PIPE,
            cwd=ROOT,
            env=RELAY_ENV,
        )
        try:
            time.sleep(2.0)  # relay started and connected
            if proc.poll() is not None:
                raise SystemExit(f"relay exited: {proc.stderr.read().decode() if proc.stderr else ''}")
            commits: dict[str, float] = {}
            arrivals: dict[str, float] = {}
            stop = threading.Event()
            want = int(args.rate * args.seconds) if args.rate else 10**9
            th = threading.Thread(target=reader, args=(client, key, arrivals, want, stop), daemon=True)
            th.start()
            cpu_before = cpu_seconds(proc.pid)
            started = time.monotonic()
            n = 0
            while time.monotonic() - started < args.seconds and n < want:
                if args.rate:
                    ahead = started + n / args.rate - time.monotonic()
                    if ahead > 0:
                        time.sleep(ahead)
                e = Event(type="bench.latency", stream=f"s{n % 50}", data=b"x" * 256)
                outbox.append(e)
                commits[e.id] = time.time()
                n += 1
            elapsed = time.monotonic() - started
            deadline = time.monotonic() + 15
            while len(arrivals) < n and time.monotonic() < deadline:
                time.sleep(0.05)
            stop.set()
            th.join()
            relay_cpu = cpu_seconds(proc.pid) - cpu_before
            busy = time.monotonic() - started  # appending, then waiting for the last arrivals
            lat = [(arrivals[i] - t) * 1000 for i, t in commits.items() if i in arrivals]
            kind = "postgresql" if url.startswith("postgresql") else "sqlite"
            print(f"{kind}: appended {n} at {n / elapsed:.0f} ev/s; arrived {len(lat)}")
            if lat:
                print(
                    f"{kind}: commit->redis latency ms: p50 {statistics.median(lat):.2f}  "
                    f"p90 {percentile(lat, 0.90):.2f}  p99 {percentile(lat, 0.99):.2f}  max {max(lat):.2f}"
                )
                print(
                    f"{kind}: relay CPU {relay_cpu:.2f} s while busy ({100 * relay_cpu / busy:.1f}% of a core "
                    f"over {busy:.1f} s), {relay_cpu / len(lat) * 1e6:.0f} µs per event"
                )
            if args.idle:
                time.sleep(1.0)
                before = cpu_seconds(proc.pid)
                time.sleep(args.idle)
                used = cpu_seconds(proc.pid) - before
                print(f"{kind}: idle relay CPU {used:.3f} s over {args.idle:.0f} s ({100 * used / args.idle:.2f}%)")
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
            outbox.close()
            client.delete(key)
            client.close()
            if url.startswith("postgresql"):
                import psycopg

                with psycopg.connect(args.outbox.split("?", 1)[0], autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
