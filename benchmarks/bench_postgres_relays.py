"""Several relay processes on one PostgreSQL outbox: CPU per event, lanes never shared, crash takeover.

    .venv/bin/python benchmarks/bench_postgres_relays.py [--count 100000] [--streams 100] [--size 1024]
        [--relays 3] [--lease 5] [--skip-kill]

On two cores three relays cannot drain faster than one (they and PostgreSQL
share the cores), so this measures what can be shown there:

* **CPU per event**: the same ``--count`` events (fresh schema each time) are
  drained by 1, then by ``--relays`` relay processes at once into the memory
  transport. Printed: the relays' CPU (each process's CPU while it drained),
  the CPU of the PostgreSQL backends serving them (``/proc`` of the server
  processes whose ``application_name`` names the run), both per relayed
  event, and the ratio of the totals N relays / 1 relay (target <= 1.25).
* **No lane held by two relays**: every relay records, per batch, the time
  its send started and ended (``time.time()``, one clock: same host); two
  relays sending the same stream of the same destination at overlapping
  times would break per-stream order. Printed as the number of overlaps
  (must be 0), together with exactly-once delivery and per-stream order.
* **Crash takeover** (unless ``--skip-kill``): ``--relays`` relays with
  ``lease_seconds = --lease``; when half the events are delivered one relay
  (whose sends take 50 ms, so that it holds lanes most of the time) is
  SIGKILLed; its lanes (read from the outbox right after the kill) must be
  resumed by another relay within ``--lease`` + 2 s. Printed: the measured
  gap (kill -> first send of the last of those lanes by a survivor), and that
  every event was sent at least once, first sends in per-stream order (each
  relay's transport writes what it accepted before the relay settles it).

Uses ``OUTRELAY_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1/test);
PostgreSQL must run on this host (its processes' CPU is read from ``/proc``).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg
from _cpu import backends_cpu

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.contract.transport import Message, SendResult
from outrelay.transports.memory import MemoryConfig, MemoryTransport

URL = os.environ.get("OUTRELAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1/test").split("?", 1)[0]


class Recording(MemoryTransport):
    """The memory transport, writing one line per batch it accepted (destination, send start and end,
    [[stream, seq], ...]), flushed before the relay settles it: what a killed relay sent stays on record."""

    def __init__(self, path: str, **options: Any) -> None:
        super().__init__(MemoryConfig(**options), destination="mem")
        self.file = open(path, "a")  # noqa: SIM115 - open for the process's life

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        started = time.time()
        results = await super().send(batch)
        events = [[m.event.stream, m.event.sequence] for m in batch]
        self.file.write(json.dumps([self.destination, started, time.time(), events]) + "\n")
        self.file.flush()
        return list(results)


def child(url: str, record: str, lease: float, latency: float) -> None:
    """One relay process: drain ``url`` into the memory transport; report its owner and backends' CPU."""
    cfg = parse_config(
        {
            "outbox": {"url": url},
            "relay": {"poll_interval": 0.2, "route_batch": 2000, "drain_retry_bound": 5, "lease_seconds": lease},
            "destinations": {"mem": {"transport": "memory", "batch_size": 1000}},
        }
    )
    outbox = Outbox.open(url)
    relay = Relay(outbox, cfg, transports={"mem": Recording(record, broker="child", latency=latency)})  # type: ignore[arg-type]
    print(json.dumps({"owner": relay.owner}), flush=True)
    sys.stdin.readline()
    cpu = time.process_time()
    asyncio.run(relay.run(drain=True))
    cpu = time.process_time() - cpu
    name = url.split("application_name=", 1)[1].split("&", 1)[0]
    print(json.dumps({"cpu": cpu, "backend_cpu": backends_cpu(URL, name)}), flush=True)
    outbox.close()


def fill(url: str, count: int, streams: int, size: int) -> None:
    outbox = Outbox.open(url)
    pad = "x" * max(0, size - 40)
    for start in range(0, count, 1000):
        outbox.append(
            [
                Event(type="bench.step", stream=f"s{i % streams}", data={"i": i, "pad": pad})
                for i in range(start, min(count, start + 1000))
            ]
        )
    outbox.close()


def schema_url() -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    return schema, f"{URL}?schema={schema}"


def drop(schema: str) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def start(
    url: str, n: int, tmp: Path, lease: float, slow_first: float = 0.0
) -> list[tuple[subprocess.Popen[str], str, str]]:
    """``n`` relay processes, each ready (imports done, outbox open); returns (process, owner, record file).
    ``slow_first``: seconds each send of the first one takes (it then holds lanes most of the time)."""
    out = []
    for i in range(n):
        record = str(tmp / f"r{i}.jsonl")
        named = f"{url}&application_name=outrelay-bench-{tmp.name}-{i}"  # its backends, for their CPU
        p = subprocess.Popen(
            [sys.executable, __file__, "--child", named, record, str(lease), str(slow_first if i == 0 else 0.0)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert p.stdout is not None
        out.append((p, json.loads(p.stdout.readline())["owner"], record))
    return out


def go(procs: list[tuple[subprocess.Popen[str], str, str]]) -> None:
    for p, _, _ in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()


def records(files: list[str]) -> list[tuple[int, str, float, float, list[list[Any]]]]:
    """(relay index, destination, send start, send end, [[stream, seq], ...]) of every batch sent."""
    out = []
    for i, path in enumerate(files):
        if os.path.exists(path):
            with open(path) as f:
                out += [(i, *json.loads(line)) for line in f if line.endswith("\n")]
    return out


class SentSoFar:
    """How many events the relays' record files hold so far, read incrementally (cheap to poll)."""

    def __init__(self, files: list[str]) -> None:
        self.offsets = dict.fromkeys(files, 0)
        self.count = 0

    def __call__(self) -> int:
        for path, offset in self.offsets.items():
            if not os.path.exists(path):
                continue
            with open(path) as f:
                f.seek(offset)
                chunk = f.read()
            done = chunk.rfind("\n") + 1  # complete lines only
            self.count += sum(len(json.loads(line)[3]) for line in chunk[:done].splitlines())
            self.offsets[path] = offset + len(chunk[:done].encode())
        return self.count


def check(batches: list[tuple[int, str, float, float, list[list[Any]]]], count: int) -> tuple[int, int, int]:
    """(events sent at least once, lanes out of order, overlapping sends of one lane by two relays)."""
    firsts: dict[tuple[str, str], list[int]] = defaultdict(list)
    seen: set[tuple[str, int]] = set()
    spans: dict[tuple[str, str], list[tuple[float, float, int]]] = defaultdict(list)
    for relay, dest, t0, t1, events in sorted(batches, key=lambda b: b[2]):
        for stream in {s for s, _ in events}:
            spans[(dest, stream)].append((t0, t1, relay))
        for stream, seq in events:
            if (dest, seq) not in seen:
                seen.add((dest, seq))
                firsts[(dest, stream)].append(seq)
    disorder = sum(1 for seqs in firsts.values() if seqs != sorted(seqs))
    overlaps = 0
    for lane in spans.values():
        for (_a0, a1, ra), (b0, _b1, rb) in itertools.pairwise(lane):
            overlaps += int(ra != rb and b0 < a1)
    return len(seen), disorder, overlaps


def drain(n: int, args: argparse.Namespace) -> tuple[float, float, float]:
    """Drain a fresh outbox with ``n`` relays; returns (relays' CPU s, backends' CPU s, seconds)."""
    schema, url = schema_url()
    try:
        fill(url, args.count, args.streams, args.size)
        with tempfile.TemporaryDirectory() as tmp:
            procs = start(url, n, Path(tmp), 60.0)
            started = time.perf_counter()
            go(procs)
            relay_cpu = server = 0.0
            for p, _, _ in procs:
                out, _ = p.communicate(timeout=600)
                report = json.loads(out.strip().splitlines()[-1])
                relay_cpu += report["cpu"]
                server += report["backend_cpu"]
            elapsed = time.perf_counter() - started
            got, disorder, overlaps = check(records([r for _, _, r in procs]), args.count)
    finally:
        drop(schema)
    us = 1e6 / args.count
    print(
        f"{n} relay(s): {args.count / elapsed:8,.0f} ev/s ({elapsed:.1f} s); "
        f"CPU per event: relays {relay_cpu * us:.1f} + PostgreSQL backends {server * us:.1f} "
        f"= {(relay_cpu + server) * us:.1f} µs; events {got}/{args.count}, "
        f"lanes out of order {disorder}, sends of one lane by two relays at once {overlaps}"
    )
    return relay_cpu, server, elapsed


def kill_one(args: argparse.Namespace) -> None:
    """Kill one of ``--relays`` relays mid-drain and time the takeover of its lanes."""
    schema, url = schema_url()
    try:
        fill(url, args.count, args.streams, args.size)
        with tempfile.TemporaryDirectory() as tmp:
            procs = start(url, args.relays, Path(tmp), args.lease, slow_first=0.05)
            files = [r for _, _, r in procs]
            go(procs)
            deadline = time.monotonic() + 120
            victim, owner, _ = procs[0]
            lanes = f'"{schema}".outrelay_lanes'
            sent = SentSoFar(files)
            with psycopg.connect(URL, autocommit=True) as conn:
                # mid-drain: half the events sent, and the victim holding lanes at that moment
                while time.monotonic() < deadline and (
                    sent() < args.count // 2
                    or not conn.execute(f"SELECT 1 FROM {lanes} WHERE owner = %s", (owner,)).fetchone()
                ):
                    time.sleep(0.005)
                victim.send_signal(signal.SIGKILL)
                killed_at = time.time()
                victim.wait()
                held = set(conn.execute(f"SELECT destination, stream FROM {lanes} WHERE owner = %s", (owner,)))
            for p, _, _ in procs[1:]:
                p.communicate(timeout=600)
            batches = records(files)
    finally:
        drop(schema)
    got, disorder, _ = check(batches, args.count)
    resumed: dict[tuple[str, str], float] = {}
    for relay, dest, t0, _t1, events in batches:
        for stream in {s for s, _ in events}:
            if relay != 0 and (dest, stream) in held and t0 >= killed_at:
                resumed[(dest, stream)] = min(resumed.get((dest, stream), t0), t0)
    gap = max(resumed.values()) - killed_at if resumed and len(resumed) == len(held) else float("nan")
    print(
        f"SIGKILL of 1 of {args.relays} relays mid-drain (lease {args.lease:g} s): it held {len(held)} lane(s); "
        f"{len(resumed)} resumed by another relay, the last {gap:.2f} s after the kill "
        f"(bound: lease + 2 s = {args.lease + 2:g} s); events sent {got}/{args.count}, lanes out of order {disorder}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--relays", type=int, default=3)
    ap.add_argument("--lease", type=float, default=5.0, help="lease_seconds of the kill run")
    ap.add_argument("--skip-kill", action="store_true")
    ap.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], args.child[1], float(args.child[2]), float(args.child[3]))
        return
    one = drain(1, args)
    many = drain(args.relays, args)
    print(
        f"total CPU per event, {args.relays} relays / 1 relay: {(many[0] + many[1]) / (one[0] + one[1]):.2f} "
        "(target <= 1.25)"
    )
    if not args.skip_kill:
        kill_one(args)


if __name__ == "__main__":
    main()
