"""Relay throughput SQLite -> NATS JetStream next to raw nats-py, same server, same run.

    .venv/bin/python benchmarks/bench_nats.py [--count 100000] [--streams 100] [--size 1024]

Uses ``OUTRELAY_NATS_URL`` (default ``nats://127.0.0.1:4222``). Each run gets
a fresh file-storage stream (capped with discard=old so disk use stays
bounded), deleted at the end. Prints events/s for:

* raw:   one connection, ``js.publish_async`` pipelined in windows of
         ``--window`` (then all acks awaited), the same 1 KB payloads with the
         same ce-* headers and Nats-Msg-Id (built before the clock starts,
         as in bench_kafka, unless ``--encode-in-raw``);
* relay: ``outrelay.Relay(drain=True)`` from a SQLite outbox holding the
         events (append time excluded) through the nats transport;
* engine ceiling: the same relay run into the in-process ``memory`` transport.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import tempfile
import time
import uuid
from collections.abc import Mapping

import nats
import nats.js.api
from _ratio import cpu_line, ratio, raw_line, record_cpu

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.model import cloudevents


def make_events(count: int, streams: int, size: int) -> list[Event]:
    payload = b"x" * size
    return [Event(type="bench.nats", stream=f"s{i % streams}", data=payload) for i in range(count)]


async def create_stream(url: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    name, subject = f"BENCH_{tag}".upper(), f"bench.{tag}"
    nc = await nats.connect(url)
    try:
        await nc.jetstream().add_stream(
            name=name,
            subjects=[f"{subject}.>"],
            storage=nats.js.api.StorageType.FILE,
            max_msgs=50_000,
            discard=nats.js.api.DiscardPolicy.OLD,
            duplicate_window=120,
        )
    finally:
        await nc.close()
    return name, subject


async def delete_stream(url: str, name: str) -> None:
    nc = await nats.connect(url)
    try:
        await nc.jetstream().delete_stream(name)
    finally:
        await nc.close()


async def raw(url: str, subject: str, events: list[Event], window: int, encode_inside: bool = False) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream(publish_async_max_pending=window)
    started, cpu = time.perf_counter(), time.process_time()
    msgs = []
    for e in events:
        headers = cloudevents.binary_headers(e)
        headers["Nats-Msg-Id"] = e.id
        headers["Content-Type"] = e.content_type or ""
        msgs.append((f"{subject}.{e.stream}", e.data, headers))
    try:
        if not encode_inside:  # like bench_kafka: building the headers is not timed
            started, cpu = time.perf_counter(), time.process_time()
        for lo in range(0, len(msgs), window):
            futs = [await js.publish_async(s, d, headers=h) for s, d, h in msgs[lo : lo + window]]
            await asyncio.gather(*futs)
        record_cpu("raw", cpu)
        return time.perf_counter() - started
    finally:
        await nc.close()


async def relay(
    dest: Mapping[str, object], events: list[Event], batch_size: int, in_flight: int, per_stream: int
) -> float:
    """Seconds a ``Relay(drain=True)`` takes to deliver ``events`` (appended beforehand, untimed) to ``dest``."""
    return (await relay_cpu(dest, events, batch_size, in_flight, per_stream))[0]


async def relay_cpu(
    dest: Mapping[str, object], events: list[Event], batch_size: int, in_flight: int, per_stream: int
) -> tuple[float, float]:
    """:func:`relay`'s seconds, and the CPU seconds this process spent meanwhile (every thread of it)."""
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/o.db"
        outbox = Outbox.open(url)
        for lo in range(0, len(events), 10_000):
            outbox.append(events[lo : lo + 10_000])
        cfg = parse_config(
            {
                "outbox": {"url": url},
                "destinations": {
                    "d": {**dest, "batch_size": batch_size, "max_in_flight": in_flight, "per_stream": per_stream}
                },
            }
        )
        started, cpu = time.perf_counter(), time.process_time()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.perf_counter() - started
        record_cpu("ceiling" if dest["transport"] == "memory" else "relay", cpu)
        cpu = time.process_time() - cpu
        outbox.close()
    delivered = summary.counts["d"]["delivered"]
    assert delivered == len(events), f"relay delivered {delivered} of {len(events)}"
    return elapsed, cpu


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--per-stream", type=int, default=16, help="relay: events of one stream per batch (config default)")
    ap.add_argument("--window", type=int, default=4000, help="raw client: publishes in flight before awaiting")
    ap.add_argument(
        "--strict", action="store_true", help="relay with pipeline = false (one unacked message per stream)"
    )
    ap.add_argument("--encode-in-raw", action="store_true", help="time the raw client's header building too")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the memory-transport engine run")
    args = ap.parse_args()

    url = os.environ.get("OUTRELAY_NATS_URL", "nats://127.0.0.1:4222")
    events = make_events(args.count, args.streams, args.size)
    n = len(events)
    name, subject = await create_stream(url)
    try:
        t_raw = await raw(url, subject, events, args.window, args.encode_in_raw)
        await delete_stream(url, name)
        name, subject = await create_stream(url)
        dest = {
            "transport": "nats",
            "servers": [url],
            "subject": subject + ".{stream}",
            "expected_stream": name,
            "pipeline": not args.strict,
        }
        t_relay = await relay(dest, events, args.batch_size, args.in_flight, args.per_stream)
        await delete_stream(url, name)
        name, subject = await create_stream(url)
        t_raw2 = await raw(url, subject, events, args.window, args.encode_in_raw)
    finally:
        await delete_stream(url, name)
    print(f"nats jetstream @ {url}, {n} events x {args.size} B, {args.streams} streams, file storage")
    what = "incl. encoding" if args.encode_in_raw else "pre-encoded"
    print(f"  raw nats-py publish_async pipelined : {raw_line(n, t_raw, t_raw2)}, {what}")
    print(f"  outrelay relay -> nats              : {n / t_relay:10.0f} ev/s ({t_relay:.2f} s)")
    print(
        f"  relay settings: pipeline={not args.strict} batch_size={args.batch_size} "
        f"per_stream={args.per_stream} max_in_flight={args.in_flight}"
    )
    print(f"  ratio relay/raw                     : {ratio(n, t_relay, t_raw, t_raw2):10.2f}")
    if not args.no_ceiling:
        t_mem = await relay({"transport": "memory"}, events, args.batch_size, args.in_flight, args.per_stream)
        print(f"  engine ceiling (relay->memory)      : {n / t_mem:10.0f} ev/s ({t_mem:.2f} s)")
    print(f"  {cpu_line(n)}")


if __name__ == "__main__":
    asyncio.run(main())
