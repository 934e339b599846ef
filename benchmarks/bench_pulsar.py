"""Relay throughput SQLite → Pulsar beside the raw pulsar-client producer, in one run.

    .venv/bin/python benchmarks/bench_pulsar.py [--events 20000] [--streams 50]

Starts pulsar-lite on a free port unless ``OUTRELAY_PULSAR_URL`` is set, then
measures:

* raw: one batching producer, ``send_async`` of every message (same body,
  ``ce_*`` properties and partition key as the transport) and ``flush``,
  counting confirmed callbacks;
* relay: ``Relay(outbox).run(drain=True)`` over the same number of events
  already appended to a SQLite outbox (appending is not timed);

and prints both rates and relay/raw.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import pulsar  # noqa: E402

from outrelay import Event, Outbox, Relay, parse_config  # noqa: E402
from outrelay.transports.pulsar._wire import properties  # noqa: E402
from tests.peers.pulsar import pulsar_binary  # noqa: E402
from tests.services import free_port, wait_port  # noqa: E402


def events(n: int, streams: int) -> list[Event]:
    return [Event(type="bench.event", stream=f"s{i % streams}", data={"i": i, "pad": "x" * 100}) for i in range(n)]


def raw_rate(url: str, topic: str, evs: list[Event]) -> float:
    client = pulsar.Client(url, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
    producer = client.create_producer(
        topic,
        batching_enabled=True,
        batching_max_publish_delay_ms=5,
        max_pending_messages=10_000,
        block_if_queue_full=True,
    )
    prepared = [(e.data, properties(e), e.stream) for e in evs]
    done = threading.Semaphore(0)
    failures: list[object] = []

    def callback(result: object, _msg_id: object) -> None:
        if result != pulsar.Result.Ok:
            failures.append(result)
        done.release()

    started = time.perf_counter()
    for data, props, key in prepared:
        producer.send_async(data, callback, properties=props, partition_key=key)
    producer.flush()
    for _ in prepared:
        done.acquire()
    elapsed = time.perf_counter() - started
    producer.close()
    client.close()
    assert not failures, failures[:3]
    return len(evs) / elapsed


async def relay_rate(url: str, topic: str, evs: list[Event]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        outbox = Outbox.open(f"sqlite:///{tmp}/o.db")
        outbox.append(evs)
        dest = {"transport": "pulsar", "service_url": url, "topic": topic, "batch_size": 1000, "max_in_flight": 4}
        cfg = parse_config({"outbox": {"url": outbox.url}, "destinations": {"d": dest}})
        started = time.perf_counter()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.perf_counter() - started
        assert summary.remaining == 0 and summary.dead_lettered == 0, summary
        close = getattr(outbox.store, "close", None)
        if close:
            close()
    return len(evs) / elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=50)
    args = ap.parse_args()
    url = os.environ.get("OUTRELAY_PULSAR_URL")
    proc = None
    tmp = tempfile.TemporaryDirectory()
    if not url:
        binary = pulsar_binary()
        if binary is None:
            sys.exit("pulsar-lite is not installed and OUTRELAY_PULSAR_URL is not set")
        port = free_port()
        proc = subprocess.Popen(
            [str(binary), "--addr", f"127.0.0.1:{port}", "--db-path", f"{tmp.name}/db", "--log-level", "warn"],
            cwd=tmp.name,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_port("127.0.0.1", port, 30):
            sys.exit("pulsar-lite did not start")
        url = f"pulsar://127.0.0.1:{port}"
    try:
        print(f"broker {url}; {args.events} events over {args.streams} streams")
        base = f"persistent://public/default/bench-{uuid.uuid4().hex[:8]}"
        raw = raw_rate(url, base + "-raw", events(args.events, args.streams))
        rel = asyncio.run(relay_rate(url, base + "-relay", events(args.events, args.streams)))
        print(f"{'raw send_async msg/s':>22} {'relay msg/s':>12} {'relay/raw':>10}")
        print(f"{raw:>22.0f} {rel:>12.0f} {rel / raw:>10.2f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)
        tmp.cleanup()


if __name__ == "__main__":
    main()
