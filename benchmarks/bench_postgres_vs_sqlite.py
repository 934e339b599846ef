"""PostgreSQL outbox against SQLite outbox, relayed into the memory transport.

    python benchmarks/bench_postgres_vs_sqlite.py [--count 50000] [--streams 100] [--size 1024]
        [--mode both] [--rounds 1]

``--mode compare`` (part of ``both``): the same ``--count`` events are
appended (untimed) to a fresh SQLite file and to a fresh PostgreSQL schema,
then each is drained by ``Relay(drain=True)`` into the memory transport in
this process; prints both rates and PostgreSQL/SQLite (target ≥ 0.8).
``--rounds N`` repeats the pair N times (fresh file and schema each time) and
prints the median ratio: on a shared machine one pair's ratio moves by ±0.15.
Each line also gives the CPU per event: this process's (the relay; its store
threads included) and, for a PostgreSQL on this host, the server's (every
``postgres`` process's CPU, from ``/proc``), which move far less than ev/s.

``--mode relays`` (part of ``both``): the events are appended to a fresh
PostgreSQL schema and drained by 1, then (on a fresh schema) by 3 relay
processes at once, each into its own memory transport; the time is from the
start signal to the last process's exit, and every event must be delivered
exactly once overall. Prints both rates and 3/1 (target ≥ 2).

``--profile FILE`` writes a cProfile of the PostgreSQL drain (compare mode).
Uses ``OUTRELAY_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1/test).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from _cpu import stat_cpu

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.memory import MemoryTransport

URL = os.environ.get("OUTRELAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1/test").split("?", 1)[0]


def config(url: str, broker: str) -> object:
    return parse_config(
        {
            "outbox": {"url": url},
            "relay": {"poll_interval": 0.2, "route_batch": 2000, "drain_retry_bound": 5},
            "destinations": {"mem": {"transport": "memory", "broker": broker, "batch_size": 1000}},
        }
    )


def fill(url: str, count: int, streams: int, size: int) -> None:
    """Append ``count`` events of about ``size`` bytes over ``streams`` streams (untimed)."""
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


def server_cpu() -> float | None:
    """CPU seconds of every ``postgres`` process on this host so far (exited backends are in their
    parent's children times), or None where ``/proc`` is not readable."""
    total = 0.0
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return None
    for pid in pids:
        try:
            name, seconds = stat_cpu(pid, children=True)
        except OSError:  # gone meanwhile
            continue
        if "postgres" in name:
            total += seconds
    return total or None


def drain(url: str, broker: str, count: int | None, profile: str | None = None) -> tuple[float, int]:
    """Drain the outbox at ``url`` into memory broker ``broker``; returns (seconds, delivered)."""
    outbox = Outbox.open(url)
    relay = Relay(outbox, config(url, broker))  # type: ignore[arg-type]
    prof = cProfile.Profile() if profile else None
    started = time.perf_counter()
    if prof:
        prof.enable()
    summary = asyncio.run(relay.run(drain=True))
    if prof:
        prof.disable()
        prof.dump_stats(profile)
    elapsed = time.perf_counter() - started
    outbox.close()
    got = len(MemoryTransport.broker(broker).all())
    if count is not None:
        assert got == count and summary.remaining == 0, (got, summary.remaining)
    return elapsed, got


def pg_schema_url() -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    return schema, f"{URL}?schema={schema}"


def drop(schema: str) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def compare(count: int, streams: int, size: int, profile: str | None, rounds: int = 1) -> None:
    ratios = []
    for n in range(1, rounds + 1):
        with tempfile.TemporaryDirectory() as d:
            lite = f"sqlite:///{Path(d) / 'outbox.db'}"
            fill(lite, count, streams, size)
            cpu = time.process_time()
            lite_s, _ = drain(lite, f"lite{n}", count)
            lite_cpu = time.process_time() - cpu
        schema, pg = pg_schema_url()
        try:
            fill(pg, count, streams, size)
            cpu, server = time.process_time(), server_cpu()
            pg_s, _ = drain(pg, f"pg{n}", count, profile)
            pg_cpu, after = time.process_time() - cpu, server_cpu()
        finally:
            drop(schema)
        lite_rate, pg_rate = count / lite_s, count / pg_s
        ratios.append(pg_rate / lite_rate)
        us = 1e6 / count
        served = f", server {(after - server) * us:.1f}" if server is not None and after is not None else ""
        print(
            f"SQLite     -> memory: {lite_rate:8,.0f} ev/s ({count} events, {streams} streams, {size} B, {lite_s:.1f}s)"
        )
        print(f"PostgreSQL -> memory: {pg_rate:8,.0f} ev/s ({pg_s:.1f}s)")
        print(f"CPU per event: SQLite relay {lite_cpu * us:.1f} µs; PostgreSQL relay {pg_cpu * us:.1f}{served} µs")
        print(f"ratio PostgreSQL/SQLite: {pg_rate / lite_rate:.2f} (target >= 0.8)")
    if rounds > 1:
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"median ratio PostgreSQL/SQLite over {rounds} rounds: {statistics.median(ratios):.2f} ({listed})")


def processes(url: str, n: int) -> tuple[float, int]:
    """Drain ``url`` with ``n`` relay processes; returns (seconds, delivered in all)."""
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--child", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(n)
    ]
    for p in procs:  # each has opened its outbox and imported everything
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    started = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    total = 0
    for p in procs:
        out, _ = p.communicate(timeout=600)
        total += int(out.split()[-1])
    return time.perf_counter() - started, total


def child(url: str) -> None:
    outbox = Outbox.open(url)
    relay = Relay(outbox, config(url, "child"))  # type: ignore[arg-type]
    print("ready", flush=True)
    sys.stdin.readline()
    asyncio.run(relay.run(drain=True))
    outbox.close()
    print(len(MemoryTransport.broker("child").all()), flush=True)


def relays(count: int, streams: int, size: int) -> None:
    rates = {}
    for n in (1, 3):
        schema, pg = pg_schema_url()
        try:
            fill(pg, count, streams, size)
            elapsed, got = processes(pg, n)
        finally:
            drop(schema)
        assert got == count, (n, got, count)
        rates[n] = count / elapsed
        print(f"{n} relay process(es) on one PostgreSQL outbox -> memory: {rates[n]:8,.0f} ev/s ({elapsed:.1f}s)")
    print(f"ratio 3 relays / 1 relay: {rates[3] / rates[1]:.2f} (target >= 2)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=50_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--mode", choices=("compare", "relays", "both"), default="both")
    ap.add_argument("--rounds", type=int, default=1, help="compare: repeat the pair and print the median ratio")
    ap.add_argument("--profile", help="write a cProfile of the PostgreSQL drain here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    if args.mode in ("compare", "both"):
        compare(args.count, args.streams, args.size, args.profile, args.rounds)
    if args.mode in ("relays", "both"):
        relays(args.count, args.streams, args.size)


if __name__ == "__main__":
    main()
