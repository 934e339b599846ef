"""Relay throughput SQLite -> Redis Streams next to the raw redis-py pipeline, same server, same run.

    .venv/bin/python benchmarks/bench_redis.py [--count 100000] [--streams 100] [--size 1024]

Uses ``OUTRELAY_REDIS_URL`` or redis://127.0.0.1:6379/0 (keys ``outrelay-bench:*``,
deleted afterwards). Prints events/s for:

* raw:   redis-py asyncio, ``pipeline(transaction=False)`` of XADDs with the same
         fields the transport writes, ``--window`` commands per round trip;
* relay: ``outrelay.Relay(drain=True)`` from a SQLite outbox holding the events
         (append time excluded) through the redis transport;
* engine ceiling: the same relay into the in-process ``memory`` transport.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid

import redis.asyncio as aioredis
from _ratio import cpu_line, ratio, raw_line, record_cpu

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.redis._transport import encode


def make_events(count: int, streams: int, size: int) -> list[Event]:
    payload = b"x" * size
    return [Event(type="bench.redis", stream=f"s{i % streams}", data=payload) for i in range(count)]


async def raw(url: str, key: str, events: list[Event], window: int) -> float:
    client = aioredis.Redis.from_url(url)
    entries = [encode(e, "binary") for e in events]
    try:
        started, cpu = time.perf_counter(), time.process_time()
        for lo in range(0, len(entries), window):
            pipe = client.pipeline(transaction=False)
            for fields in entries[lo : lo + window]:
                pipe.xadd(key, fields)  # type: ignore[arg-type]
            await pipe.execute()
        record_cpu("raw", cpu)
        return time.perf_counter() - started
    finally:
        await client.delete(key)
        await client.aclose()


async def relay(dest: dict[str, object], events: list[Event], batch_size: int, in_flight: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/o.db"
        outbox = Outbox.open(url)
        for lo in range(0, len(events), 10_000):
            outbox.append(events[lo : lo + 10_000])
        cfg = parse_config(
            {
                "outbox": {"url": url},
                "destinations": {
                    "d": {**dest, "batch_size": batch_size, "max_in_flight": in_flight, "per_stream": 1000}
                },
            }
        )
        started, cpu = time.perf_counter(), time.process_time()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.perf_counter() - started
        record_cpu("ceiling" if dest["transport"] == "memory" else "relay", cpu)
        outbox.close()
    delivered = summary.counts["d"]["delivered"]
    assert delivered == len(events), f"relay delivered {delivered} of {len(events)}"
    return elapsed


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--window", type=int, default=1000, help="raw client: XADDs per pipeline round trip")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the memory-transport engine run")
    args = ap.parse_args()
    url = os.environ.get("OUTRELAY_REDIS_URL", "redis://127.0.0.1:6379/0")
    events = make_events(args.count, args.streams, args.size)
    n = len(events)
    t_raw = await raw(url, f"outrelay-bench:{uuid.uuid4().hex[:8]}", events, args.window)
    key = f"outrelay-bench:{uuid.uuid4().hex[:8]}"
    try:
        t_relay = await relay(
            {"transport": "redis", "url": url, "stream": key}, events, args.batch_size, args.in_flight
        )
    finally:
        client = aioredis.Redis.from_url(url)
        await client.delete(key)
        await client.aclose()
    t_raw2 = await raw(url, f"outrelay-bench:{uuid.uuid4().hex[:8]}", events, args.window)
    print(f"redis @ {url}, {n} events x {args.size} B, {args.streams} streams, one Redis stream key")
    print(f"  raw redis-py pipeline XADD    : {raw_line(n, t_raw, t_raw2)}")
    print(f"  outrelay relay -> redis       : {n / t_relay:10.0f} ev/s ({t_relay:.2f} s)")
    print(f"  ratio relay/raw               : {ratio(n, t_relay, t_raw, t_raw2):10.2f}")
    if not args.no_ceiling:
        t_mem = await relay({"transport": "memory"}, events, args.batch_size, args.in_flight)
        print(f"  engine ceiling (relay->memory): {n / t_mem:10.0f} ev/s ({t_mem:.2f} s)")
    print(f"  {cpu_line(n)}")


if __name__ == "__main__":
    asyncio.run(main())
