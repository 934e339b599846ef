"""Relay throughput SQLite -> Pub/Sub next to the raw google-cloud-pubsub client, same emulator, same run.

    .venv/bin/python benchmarks/bench_pubsub.py [--count 20000] [--streams 50] [--size 1024]

Uses ``OUTRELAY_PUBSUB_EMULATOR_HOST`` when set, otherwise starts the official
emulator on a free port (and stops it at the end). Prints events/s for:

* raw:   one ``PublisherClient`` with message ordering on, the same payloads,
         ``ce-*`` attributes and ordering keys (built before the clock starts),
         every future awaited;
* relay: ``outrelay.Relay(drain=True)`` from a SQLite outbox holding the
         events (append time excluded) through the pubsub transport.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.model import cloudevents
from outrelay.transports.pubsub._client import make_publisher
from outrelay.transports.pubsub._config import PubSubConfig

PROJECT = "test-project"


def start_emulator() -> tuple[str, object | None]:
    if os.environ.get("OUTRELAY_PUBSUB_EMULATOR_HOST"):
        return os.environ["OUTRELAY_PUBSUB_EMULATOR_HOST"], None
    from tests.peers import pubsub_emulator as pe

    host = pe._start()
    return host, pe


def raw(host: str, topic: str, events: list[Event]) -> float:
    cfg = PubSubConfig(project=PROJECT, topic=topic, emulator_host=host, max_latency=0.005)
    client = make_publisher(cfg)
    path = cfg.topic_path(topic)
    msgs = []
    for e in events:
        attrs = cloudevents.binary_headers(e)
        attrs["content-type"] = e.content_type or ""
        msgs.append((e.data, e.stream, attrs))
    try:
        started = time.perf_counter()
        futs = [client.publish(path, d, ordering_key=k, **a) for d, k, a in msgs]
        concurrent.futures.wait(futs)
        assert all(f.exception() is None for f in futs)
        return time.perf_counter() - started
    finally:
        client.stop()


async def relay(host: str, topic: str, events: list[Event], batch_size: int, per_stream: int, in_flight: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/o.db"
        outbox = Outbox.open(url)
        outbox.append(events)
        dest = {"transport": "pubsub", "project": PROJECT, "topic": topic, "emulator_host": host}
        cfg = parse_config(
            {
                "outbox": {"url": url},
                "destinations": {
                    "d": {**dest, "batch_size": batch_size, "per_stream": per_stream, "max_in_flight": in_flight}
                },
            }
        )
        started = time.perf_counter()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.perf_counter() - started
        outbox.close()
    assert summary.counts["d"]["delivered"] == len(events), summary.counts
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--per-stream", type=int, default=100)
    ap.add_argument("--in-flight", type=int, default=8)
    args = ap.parse_args()
    host, emulator = start_emulator()
    try:
        from tests.peers.pubsub_emulator import create_topic

        payload = b"x" * args.size
        events = [Event(type="bench.pubsub", stream=f"s{i % args.streams}", data=payload) for i in range(args.count)]
        raw_topic, relay_topic = f"bench-raw-{uuid.uuid4().hex[:6]}", f"bench-relay-{uuid.uuid4().hex[:6]}"
        create_topic(host, raw_topic)
        create_topic(host, relay_topic)
        t_raw = raw(host, raw_topic, events)
        t_relay = asyncio.run(relay(host, relay_topic, events, args.batch_size, args.per_stream, args.in_flight))
        n = len(events)
        print(f"pubsub emulator at {host}: {n} events, {args.streams} ordering keys, {args.size} B payloads")
        print(f"raw google-cloud-pubsub (ordering on): {n / t_raw:10.0f} events/s  ({t_raw:.2f} s)")
        print(f"outrelay relay SQLite -> pubsub:       {n / t_relay:10.0f} events/s  ({t_relay:.2f} s)")
        print(f"relay / raw:                           {t_raw / t_relay:10.2f}")
    finally:
        if emulator is not None:
            proc = emulator._started.get("proc")  # type: ignore[attr-defined]
            if proc is not None:
                emulator._stop_proc(proc)  # type: ignore[attr-defined]


if __name__ == "__main__":
    main()
