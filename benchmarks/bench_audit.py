"""What the audit chain costs: relay throughput SQLite → memory with
``[audit]`` off and on (with an HMAC key), in the same run.

    .venv/bin/python benchmarks/bench_audit.py [--count 100000] [--streams 100] [--size 1024] [--rounds 2]

Each round fills two fresh SQLite outboxes with the same events (append time
excluded), then drains each with ``Relay(drain=True)`` to the memory
transport, alternating which goes first. Prints each run's events/s, the
mean of each setting, the on/off ratio, and how many audit records the
chain holds (one per routing pass and per settled batch, not per event),
which ``verify`` then checks (its time is printed too).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from pathlib import Path

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.history.audit import AuditStore, resolve_key, verify
from outrelay.transports.memory import MemoryTransport

KEY_VAR = "OUTRELAY_BENCH_AUDIT_KEY"


def fill(url: str, count: int, streams: int, size: int) -> None:
    pad = "x" * (size - 40)
    with Outbox.open(url) as outbox:
        for start in range(0, count, 1000):
            outbox.append(
                [
                    Event(type="workflow.step", stream=f"s{i % streams}", data={"i": i, "pad": pad})
                    for i in range(start, min(count, start + 1000))
                ]
            )


async def drain(url: str, count: int, audit: bool, broker: str) -> float:
    raw = {
        "outbox": {"url": url},
        "destinations": {"mem": {"transport": "memory", "broker": broker, "batch_size": 1000}},
    }
    if audit:
        raw["audit"] = {"enabled": True, "hmac_key": f"env:{KEY_VAR}"}
    cfg = parse_config(raw)
    outbox = Outbox.open(url)
    t = time.perf_counter()
    summary = await Relay(outbox, cfg).run(drain=True)
    elapsed = time.perf_counter() - t
    got = len(MemoryTransport.broker(broker).all())
    assert got == count and summary.remaining == 0, (got, summary.remaining)
    outbox.close()
    return count / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault(KEY_VAR, "bench-audit-key-" + "k" * 32)
    rates: dict[bool, list[float]] = {False: [], True: []}
    with tempfile.TemporaryDirectory() as d:
        for rnd in range(args.rounds):
            order = (False, True) if rnd % 2 == 0 else (True, False)
            for audit in order:
                url = f"sqlite:///{Path(d) / f'r{rnd}-{int(audit)}.db'}"
                fill(url, args.count, args.streams, args.size)
                rate = asyncio.run(drain(url, args.count, audit, f"bench-{rnd}-{int(audit)}"))
                rates[audit].append(rate)
                print(f"round {rnd + 1}: audit {'on ' if audit else 'off'}  {rate:,.0f} events/s", flush=True)
        with Outbox.open(url.replace(f"-{int(audit)}.db", "-1.db")) as outbox:
            store = outbox.store
            assert isinstance(store, AuditStore)
            t = time.perf_counter()
            verdict = verify(store, resolve_key(f"env:{KEY_VAR}"))
            took = time.perf_counter() - t
    off, on = statistics.mean(rates[False]), statistics.mean(rates[True])
    print(
        f"relay SQLite -> memory ({args.count} events, {args.streams} streams, {args.size} B): "
        f"audit off {off:,.0f} events/s, audit on {on:,.0f} events/s, on/off {on / off:.2f}"
    )
    print(f"audit records for {args.count} events: {verdict.checked}; verify (hashes and MACs) took {took:.3f}s")
    assert verdict.ok, verdict.line()


if __name__ == "__main__":
    main()
