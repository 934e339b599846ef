"""Consuming throughput from Redis Streams: the raw redis-py group loop next to outrelay's group backend.

    .venv/bin/python benchmarks/bench_subscribe_redis.py [--count 20000] [--streams 100] [--size 1024]

Uses ``OUTRELAY_REDIS_URL`` or redis://127.0.0.1:6379/0 (keys ``outrelay-bench:*``,
deleted afterwards). ``--count`` events of ``--size`` bytes over ``--streams``
event streams are appended once to one stream key (the transport's own
``send``), then read back by a fresh consumer group each time, printing ev/s:

* raw:     redis-py asyncio, the idiomatic loop: ``XREADGROUP COUNT --batch``
           then one ``XACK`` of the batch's ids (no decoding), timed before and
           after the backend (``benchmarks/_ratio.py``);
* backend: ``transport.subscription(...)``, a group of one member: ``receive(--batch)``,
           decoding every entry into an Event, and ``ack()`` of each message,
           the acks of one batch awaited together (as a runtime handling
           several streams at once does) — the gate scripts included.

The ratio depends on redis-py's reply parser, named in the first line of the
output. Without ``hiredis`` (the pure-Python parser) parsing an entry field by
field is most of the raw loop's CPU; the backend's READ script returns its
entries packed into one JSON string (``outrelay/transports/redis/_gate.py``),
so the backend skips that work and can beat the raw loop. With ``hiredis``
installed the raw loop gets several times faster while the backend, whose
cost is then decoding, the gate and the per-message runtime, barely changes.

Each line also gives this process's CPU time per event (``time.process_time``,
the broker's own CPU excluded): unlike ev/s it hardly moves when other work
shares the machine, and ``cpu a/b`` is what the ratio would be if the client
were the bottleneck.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
import uuid

import redis.asyncio as aioredis
from _bus import bus_consume
from _cpu import CpuClock
from _ratio import ratio
from redis.utils import HIREDIS_AVAILABLE

from outrelay import Event, Message
from outrelay.core.contract.subscription import SubscriptionSpec
from outrelay.transports.redis._transport import RedisConfig, RedisTransport


async def raw(url: str, key: str, n: int, batch: int) -> float:
    client = aioredis.Redis.from_url(url)
    group = f"raw-{uuid.uuid4().hex[:8]}"
    try:
        await client.xgroup_create(key, group, id="0")
        started = time.perf_counter()
        seen = 0
        while seen < n:
            reply = await client.xreadgroup(group, "c1", {key: ">"}, count=batch, block=1000)
            ids = [entry_id for _key, entries in reply or () for entry_id, _fields in entries]
            if ids:
                await client.xack(key, group, *ids)
            seen += len(ids)
        return time.perf_counter() - started
    finally:
        await client.xgroup_destroy(key, group)
        await client.aclose()


async def backend(t: RedisTransport, n: int, batch: int) -> float:
    spec = SubscriptionSpec(target="", group=f"backend-{uuid.uuid4().hex[:8]}", from_beginning=True, prefetch=batch)
    b = t.subscription(spec)
    await b.start()
    try:
        started = time.perf_counter()
        seen = 0
        while seen < n:
            got = await b.receive(batch, 1.0)
            assert all(m.received is not None for m in got)
            await asyncio.gather(*(m.ack() for m in got))
            seen += len(got)
        return time.perf_counter() - started
    finally:
        await b.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256, help="messages per XREADGROUP / receive()")
    args = ap.parse_args()
    url = os.environ.get("OUTRELAY_REDIS_URL", "redis://127.0.0.1:6379/0")
    key = f"outrelay-bench:{uuid.uuid4().hex[:8]}"
    t = RedisTransport(RedisConfig(url=url, stream=key), destination="bench")
    await t.open()
    try:
        payload = b"x" * args.size
        events = [Event(type="bench.redis", stream=f"s{i % args.streams}", data=payload) for i in range(args.count)]
        for lo in range(0, len(events), 1000):
            await t.send([Message(e, key, e.stream) for e in events[lo : lo + 1000]])
        n = len(events)
        cpu = CpuClock(n)
        t_raw = await cpu.time("raw", raw(url, key, n, args.batch))
        t_backend = await cpu.time("backend", backend(t, n, args.batch))
        t_bus = await cpu.time("bus", bus_consume(t, n, prefetch=args.batch * 4))
        t_raw2 = await cpu.time("raw", raw(url, key, n, args.batch))
    finally:
        client = aioredis.Redis.from_url(url)
        await client.delete(key)
        await client.aclose()
        await t.close()
    parser = "hiredis" if HIREDIS_AVAILABLE else "pure-Python"
    print(
        f"redis @ {url}, {n} events x {args.size} B, {args.streams} streams, one key, batch {args.batch}, "
        f"{parser} reply parser"
    )
    mean = (n / t_raw + n / t_raw2) / 2
    before_after = f"(mean of {n / t_raw:,.0f} before and {n / t_raw2:,.0f} after the backend)"
    print(f"  (a) raw redis-py XREADGROUP+XACK : {mean:10.0f} ev/s {before_after}")
    print(f"  (b) outrelay group backend       : {n / t_backend:10.0f} ev/s ({t_backend:.2f} s)")
    print(f"  ratio b/a                        : {ratio(n, t_backend, t_raw, t_raw2):10.2f}")
    print(f"  (c) EventBus group member        : {n / t_bus:10.0f} ev/s ({t_bus:.2f} s, decode + runtime + handler)")
    print(f"  ratio c/a                        : {ratio(n, t_bus, t_raw, t_raw2):10.2f}")
    print(f"  client CPU per event             : {cpu.report()}")


if __name__ == "__main__":
    asyncio.run(main())
