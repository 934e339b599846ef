"""Relay throughput SQLite -> a 3-node NATS JetStream cluster (R3 stream) next to raw nats-py, same run.

    .venv/bin/python benchmarks/bench_nats_cluster.py [--count 50000] [--streams 200] [--size 1024]
    .venv/bin/python benchmarks/bench_nats_cluster.py --server-bin .venv/bin/nats-server --atomic

Starts its own 3-node nats-server cluster on free ports in a temporary
directory (``tests/cluster/_nats_cluster.py``), or uses
``OUTRELAY_NATS_CLUSTER_URLS``. Each run gets a fresh R3 file stream. Prints
events/s for the raw client (``js.publish_async`` pipelined in windows,
timed before and after the relay, see ``_ratio.py``) and for the relay with
each ``--pipeline`` value given (default: ``auto``, which on an R3 stream
without the order guard means one unacked message per stream; ``true``
pipelines unguarded, which can break order in a leader change) and
``--guard`` (``order_guard``; on a replicated stream anything but ``off``
with ``last-msg-id`` is refused at open). ``--server-bin`` names the
nats-server to start (default: the tests' ``NATS_SERVER_BIN``); ``--atomic``
creates the streams with ``allow_atomic`` (nats-server 2.12+, e.g. the dev
extra's ``.venv/bin/nats-server``), so ``auto`` and ``true`` publish atomic
batches.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import nats
import nats.js.api
from _ratio import ratio, raw_line
from bench_nats import make_events, raw, relay_cpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.cluster._nats_cluster import running_cluster
from tests.peers.nats import NATS_SERVER_BIN


async def create_stream(urls: list[str], atomic: bool = False) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    name, subject = f"BENCHCL_{tag}".upper(), f"benchcl.{tag}"
    nc = await nats.connect(urls)
    try:
        await nc.jetstream(timeout=10).add_stream(
            name=name,
            subjects=[f"{subject}.>"],
            storage=nats.js.api.StorageType.FILE,
            num_replicas=3,
            max_msgs=200_000,
            discard=nats.js.api.DiscardPolicy.OLD,
            duplicate_window=120,
            allow_atomic=True if atomic else None,
        )
    finally:
        await nc.close()
    return name, subject


async def delete_stream(urls: list[str], name: str) -> None:
    nc = await nats.connect(urls)
    try:
        await nc.jetstream(timeout=10).delete_stream(name)
    finally:
        await nc.close()


async def run(urls: list[str], args: argparse.Namespace) -> None:
    events = make_events(args.count, args.streams, args.size)
    n = len(events)
    name, subject = await create_stream(urls)
    cpu = time.process_time()
    t_raw = await raw(urls[0], subject, events, args.window)
    raw_cpu = [time.process_time() - cpu]
    await delete_stream(urls, name)
    results = []
    for pipeline in args.pipeline:
        name, subject = await create_stream(urls, args.atomic)
        dest = {
            "transport": "nats",
            "servers": urls,
            "subject": subject + ".{stream}",
            "expected_stream": name,
            "pipeline": {"true": True, "false": False}.get(pipeline, pipeline),
            "order_guard": args.guard,
        }
        results.append((pipeline, *await relay_cpu(dest, events, args.batch_size, args.in_flight, args.per_stream)))
        await delete_stream(urls, name)
    name, subject = await create_stream(urls)
    try:
        cpu = time.process_time()
        t_raw2 = await raw(urls[0], subject, events, args.window)
        raw_cpu.append(time.process_time() - cpu)
    finally:
        await delete_stream(urls, name)
    kind = "R3 file stream" + (", allow_atomic" if args.atomic else "")
    print(f"nats jetstream cluster (3 nodes, {kind}), {n} events x {args.size} B, {args.streams} streams")
    print(f"  raw nats-py publish_async pipelined : {raw_line(n, t_raw, t_raw2)}")
    for pipeline, t, _ in results:
        label = f"pipeline={pipeline}, order_guard={args.guard}"
        print(f"  outrelay relay ({label}) : {n / t:10.0f} ev/s ({t:.2f} s), ratio {ratio(n, t, t_raw, t_raw2):.2f}")
    relays = ", ".join(f"relay pipeline={pipeline} {c / n * 1e6:.1f} µs" for pipeline, _, c in results)
    print(f"  CPU per event in this process       : raw {sum(raw_cpu) / len(raw_cpu) / n * 1e6:.1f} µs, {relays}")


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=50_000)
    ap.add_argument("--streams", type=int, default=200)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--per-stream", type=int, default=16)
    ap.add_argument("--window", type=int, default=4000)
    ap.add_argument("--guard", choices=("auto", "last-msg-id", "off"), default="off")
    ap.add_argument(
        "--pipeline",
        choices=("auto", "true", "false"),
        action="append",
        help="the relay's pipeline option, once per run to compare (default: auto)",
    )
    ap.add_argument("--server-bin", default=NATS_SERVER_BIN, help="the nats-server binary to start")
    ap.add_argument("--atomic", action="store_true", help="streams allow atomic batches (nats-server 2.12+)")
    args = ap.parse_args()
    args.pipeline = args.pipeline or ["auto"]
    with running_cluster(args.server_bin) as cluster:
        asyncio.run(run(cluster.urls, args))


if __name__ == "__main__":
    main()
