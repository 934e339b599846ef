"""PostgreSQL outbox against SQLite outbox, relayed into the memory transport.

    python benchmarks/bench_postgres_vs_sqlite.py [--count 50000] [--streams 100] [--size 1024]
        [--rounds 1] [--profile FILE] [--attempts on|off] [--sqlite-only]

The same ``--count`` events are appended (untimed) to a fresh SQLite file and
to a fresh PostgreSQL schema, then each is drained by ``Relay(drain=True)``
into the memory transport in this process; prints both rates and
PostgreSQL/SQLite (target >= 0.8). ``--rounds N`` repeats the pair N times
(fresh file and schema each time) and prints the median ratio: on a shared
machine one pair's ratio moves by +-0.15. Each line also gives the CPU per
event, which moves far less than ev/s: this process's (the relay; its store
threads included) and, for a PostgreSQL on this host, that of the server
backends serving the relay's connections (target <= 25 µs; from ``/proc``,
found by the connections' ``application_name``), and of every ``postgres``
process on the host (information: the WAL writer and checkpointer work for
the relay too, but other clients of the server count there as well). It also
prints the WAL the server wrote per relayed event during the drain (from
``pg_current_wal_lsn()``): unlike CPU, it does not move with the machine's hour
(other writers to the same server count there too).

Several relay processes on one PostgreSQL outbox: ``bench_postgres_relays.py``.
``--profile FILE`` writes a cProfile of the PostgreSQL drain. ``--attempts on`` turns
the delivery-attempt log on (``[attempts] enabled = true``; off by default, as in a relay).
``--sqlite-only`` drains SQLite alone and splits its CPU into user and system time.
Uses ``OUTRELAY_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1/test).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import statistics
import tempfile
import time
import uuid
from pathlib import Path

import psycopg
from _cpu import backends_cpu, stat_cpu

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.memory import MemoryTransport

URL = os.environ.get("OUTRELAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1/test").split("?", 1)[0]
#: ``[attempts] enabled`` of the drained relays (``--attempts``)
ATTEMPTS = {"enabled": False}


def config(url: str, broker: str) -> object:
    return parse_config(
        {
            "outbox": {"url": url},
            "relay": {"poll_interval": 0.2, "route_batch": 2000, "drain_retry_bound": 5},
            "destinations": {"mem": {"transport": "memory", "broker": broker, "batch_size": 1000}},
            "attempts": ATTEMPTS,
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


def drain(url: str, broker: str, count: int | None, profile: str | None = None) -> tuple[float, int, float]:
    """Drain the outbox at ``url`` into memory broker ``broker``; returns (seconds, delivered, CPU seconds
    of the PostgreSQL backends serving it: 0.0 for SQLite or without ``application_name`` in the URL)."""
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
    name = url.split("application_name=", 1)[1].split("&", 1)[0] if "application_name=" in url else ""
    backends = backends_cpu(URL, name) if name else 0.0
    outbox.close()
    got = len(MemoryTransport.broker(broker).all())
    if count is not None:
        assert got == count and summary.remaining == 0, (got, summary.remaining)
    return elapsed, got, backends


def wal_lsn() -> int:
    """The server's current WAL write position, in bytes (two readings differ by the WAL written between)."""
    with psycopg.connect(URL, autocommit=True) as conn:
        row = conn.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')").fetchone()
    assert row is not None
    return int(row[0])


def pg_schema_url() -> tuple[str, str]:
    schema = f"bench_{uuid.uuid4().hex[:10]}"
    return schema, f"{URL}?schema={schema}&application_name=outrelay-bench-{schema}"


def drop(schema: str) -> None:
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def compare(
    count: int, streams: int, size: int, profile: str | None, rounds: int = 1, sqlite_only: bool = False
) -> None:
    ratios = []
    for n in range(1, rounds + 1):
        with tempfile.TemporaryDirectory() as d:
            lite = f"sqlite:///{Path(d) / 'outbox.db'}"
            fill(lite, count, streams, size)
            cpu, times = time.process_time(), os.times()
            lite_s, _, _ = drain(lite, f"lite{n}", count)
            lite_cpu, after_times = time.process_time() - cpu, os.times()
        if sqlite_only:
            us = 1e6 / count
            user, system = (after_times.user - times.user) * us, (after_times.system - times.system) * us
            print(f"SQLite     -> memory: {count / lite_s:8,.0f} ev/s ({count} events, {lite_s:.1f}s)")
            print(f"CPU per event: SQLite relay {lite_cpu * us:.1f} µs (user {user:.1f}, system {system:.1f})")
            continue
        schema, pg = pg_schema_url()
        try:
            fill(pg, count, streams, size)
            lsn, cpu, server = wal_lsn(), time.process_time(), server_cpu()
            pg_s, _, backends = drain(pg, f"pg{n}", count, profile)
            pg_cpu, after, wal = time.process_time() - cpu, server_cpu(), wal_lsn() - lsn
        finally:
            drop(schema)
        lite_rate, pg_rate = count / lite_s, count / pg_s
        ratios.append(pg_rate / lite_rate)
        us = 1e6 / count
        served = f", server backends {backends * us:.1f} (target <= 25)"
        if server is not None and after is not None:
            served += f", every postgres process {(after - server) * us:.1f}"
        served += f" µs; PostgreSQL WAL per event {wal / count:.0f} bytes"
        print(
            f"SQLite     -> memory: {lite_rate:8,.0f} ev/s ({count} events, {streams} streams, {size} B, {lite_s:.1f}s)"
        )
        print(f"PostgreSQL -> memory: {pg_rate:8,.0f} ev/s ({pg_s:.1f}s)")
        print(f"CPU per event: SQLite relay {lite_cpu * us:.1f}; PostgreSQL relay {pg_cpu * us:.1f}{served}")
        print(f"ratio PostgreSQL/SQLite: {pg_rate / lite_rate:.2f} (target >= 0.8)")
    if rounds > 1:
        listed = ", ".join(f"{r:.2f}" for r in ratios)
        print(f"median ratio PostgreSQL/SQLite over {rounds} rounds: {statistics.median(ratios):.2f} ({listed})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=50_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--mode", choices=("compare",), default="compare", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=1, help="compare: repeat the pair and print the median ratio")
    ap.add_argument("--profile", help="write a cProfile of the PostgreSQL drain here")
    ap.add_argument("--attempts", choices=("on", "off"), default="off", help="the delivery-attempt log")
    ap.add_argument("--sqlite-only", action="store_true", help="drain SQLite only (no PostgreSQL needed)")
    args = ap.parse_args()
    ATTEMPTS["enabled"] = args.attempts == "on"
    compare(args.count, args.streams, args.size, args.profile, args.rounds, args.sqlite_only)


if __name__ == "__main__":
    main()
