"""Relay throughput SQLite -> a 6-node Redis Cluster next to the raw redis-py cluster client, same run.

    .venv/bin/python benchmarks/bench_redis_cluster.py [--count 100000] [--streams 100] [--size 1024]

Starts its own cluster (3 primaries, 3 replicas, ``tests/cluster/_redis_cluster.py``) on free
ports in a temporary directory, or uses ``OUTRELAY_REDIS_CLUSTER_URL`` (any node; keys
``outrelay-bench:*``, deleted afterwards). One key per stream (``outrelay-bench:<run>:<stream>``),
so the keys spread over the slots of every primary. Prints events/s for:

* raw:   ``redis.asyncio.cluster.RedisCluster``, ``pipeline()`` of XADDs (one round trip per
         node per ``--window`` commands) with the same fields the transport writes, timed
         before and after the relay (see ``_ratio.py``);
* relay: ``outrelay.Relay(drain=True)`` with ``cluster = true`` (one script call per slot
         of a batch, all of them in one pipeline), and with ``--pipeline`` also
         ``batching = "pipeline"``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from _ratio import ratio, raw_line
from bench_redis import make_events, relay
from redis.asyncio.cluster import RedisCluster

from outrelay import Event
from outrelay.transports.redis._transport import encode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.cluster._redis_cluster import RedisClusterPeer


@contextlib.contextmanager
def cluster_url() -> Iterator[str]:
    """``OUTRELAY_REDIS_CLUSTER_URL``, or a private cluster killed on exit."""
    external = os.environ.get("OUTRELAY_REDIS_CLUSTER_URL")
    if external:
        yield external
        return
    with tempfile.TemporaryDirectory(prefix="outrelay-redis-cluster-") as root:
        peer = RedisClusterPeer(Path(root))
        try:
            peer.start()
            yield peer.url
        finally:
            peer.stop()


async def raw(url: str, prefix: str, events: list[Event], window: int) -> float:
    client = RedisCluster.from_url(url)
    entries = [(f"{prefix}:{e.stream}", encode(e, "binary")) for e in events]
    try:
        await client.initialize()
        started = time.perf_counter()
        for lo in range(0, len(entries), window):
            pipe = client.pipeline(transaction=False)
            for key, fields in entries[lo : lo + window]:
                pipe.xadd(key, fields)  # type: ignore[arg-type]
            await pipe.execute()
        return time.perf_counter() - started
    finally:
        await cleanup(client, prefix, events)
        await client.aclose()


async def cleanup(client: RedisCluster, prefix: str, events: list[Event]) -> None:
    for stream in {e.stream for e in events}:
        await client.delete(f"{prefix}:{stream}")


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--window", type=int, default=1000, help="raw client: XADDs per pipeline")
    ap.add_argument("--pipeline", action="store_true", help='also run the relay with batching = "pipeline"')
    args = ap.parse_args()
    events = make_events(args.count, args.streams, args.size)
    n = len(events)
    with cluster_url() as url:
        t_raw = await raw(url, f"outrelay-bench:{uuid.uuid4().hex[:8]}", events, args.window)
        timings: dict[str, float] = {}
        for batching in ("script", "pipeline") if args.pipeline else ("script",):
            prefix = f"outrelay-bench:{uuid.uuid4().hex[:8]}"
            dest = {"transport": "redis", "cluster": True, "url": url, "stream": prefix + ":{stream}"}
            try:
                timings[batching] = await relay({**dest, "batching": batching}, events, args.batch_size, args.in_flight)
            finally:
                client = RedisCluster.from_url(url)
                await cleanup(client, prefix, events)
                await client.aclose()
        t_raw2 = await raw(url, f"outrelay-bench:{uuid.uuid4().hex[:8]}", events, args.window)
    print(f"redis cluster @ {url}, {n} events x {args.size} B, {args.streams} streams, one key per stream")
    print(f"  raw redis-py cluster pipeline XADD : {raw_line(n, t_raw, t_raw2)}")
    for batching, t in timings.items():
        print(f"  outrelay relay -> cluster ({batching:<8}): {n / t:10.0f} ev/s ({t:.2f} s)")
        print(f"  ratio relay/raw ({batching:<8})        : {ratio(n, t, t_raw, t_raw2):10.2f}")


if __name__ == "__main__":
    asyncio.run(main())
