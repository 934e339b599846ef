"""Core figures: append latency and relay throughput SQLite → memory.

python benchmarks/bench_core.py [--count 100000] [--streams 100] [--size 1024]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.memory import MemoryTransport


def append_latency(path: Path, n: int, size: int) -> None:
    outbox = Outbox.open(f"sqlite:///{path}")
    pad = "x" * size
    samples = []
    for i in range(n):
        e = Event(type="workflow.step", stream=f"s{i % 100}", data={"i": i, "pad": pad})
        t = time.perf_counter()
        outbox.append(e)
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    p50 = statistics.median(samples)
    p99 = samples[int(len(samples) * 0.99) - 1]
    print(f"append latency (1 event/txn, {size} B, synchronous=FULL): p50 {p50:.3f} ms  p99 {p99:.3f} ms  (n={n})")
    outbox.close()


def fill(outbox: Outbox, count: int, streams: int, size: int) -> float:
    pad = "x" * (size - 40)
    t = time.perf_counter()
    for start in range(0, count, 1000):
        outbox.append(
            [
                Event(type="workflow.step", stream=f"s{i % streams}", data={"i": i, "pad": pad})
                for i in range(start, min(count, start + 1000))
            ]
        )
    return count / (time.perf_counter() - t)


async def relay_memory(path: Path, count: int, streams: int, size: int) -> None:
    url = f"sqlite:///{path}"
    outbox = Outbox.open(url)
    rate = fill(outbox, count, streams, size)
    print(f"append throughput (1000 events/txn): {rate:,.0f} events/s")
    cfg = parse_config(
        {
            "outbox": {"url": url},
            "destinations": {"mem": {"transport": "memory", "broker": "bench", "batch_size": 1000}},
        }
    )
    t = time.perf_counter()
    summary = await Relay(outbox, cfg).run(drain=True)
    elapsed = time.perf_counter() - t
    got = len(MemoryTransport.broker("bench").all())
    assert got == count and summary.remaining == 0, (got, summary.remaining)
    print(
        f"relay SQLite -> memory: {count / elapsed:,.0f} events/s "
        f"({count} events, {streams} streams, {size} B, {elapsed:.1f}s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--latency-samples", type=int, default=2000)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        append_latency(Path(d) / "lat.db", args.latency_samples, args.size)
        asyncio.run(relay_memory(Path(d) / "relay.db", args.count, args.streams, args.size))


if __name__ == "__main__":
    main()
