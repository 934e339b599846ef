"""Consuming throughput of a JetStream consumer group: raw nats-py next to outrelay's subscription backend.

    .venv/bin/python benchmarks/bench_subscribe_nats.py [--count 20000] [--streams 100] [--size 1024]

Uses ``OUTRELAY_NATS_URL`` (default ``nats://127.0.0.1:4222``). Pre-publishes
``--count`` 1 KB events over ``--streams`` streams (with the transport's own
``send``) into a fresh memory stream, deleted at the end, then times:

* raw:     nats-py's idiomatic loop on a fresh durable pull consumer (what a
           queue group of one does): ``fetch(batch)`` then ``ack()`` each;
* backend: ``transport.subscription(group=...)`` with one member, its
           ``receive``/``ack`` loop (``group_shards`` shards: each message is
           read once per shard and acked by the shard it does not belong to).

Prints ev/s of each and the ratio backend/raw.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
import uuid

import nats
import nats.js.api
import nats.js.errors
from _bus import bus_consume

from outrelay import Event, Message
from outrelay.core.contract.subscription import SubscriptionSpec
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._group import names
from outrelay.transports.nats._transport import NatsTransport


async def raw(url: str, stream: str, subject: str, count: int, batch: int) -> float:
    nc = await nats.connect(url)
    js = nc.jetstream()
    try:
        sub = await js.pull_subscribe(
            subject,
            durable=f"raw_{uuid.uuid4().hex[:8]}",
            stream=stream,
            config=nats.js.api.ConsumerConfig(deliver_policy=nats.js.api.DeliverPolicy.ALL, max_ack_pending=batch * 4),
        )
        started, got = time.perf_counter(), 0
        while got < count:
            for msg in await sub.fetch(batch, timeout=5):
                await msg.ack()
                got += 1
        return time.perf_counter() - started
    finally:
        await nc.close()


async def backend(t: NatsTransport, subject: str, group: str, count: int, batch: int, prefetch: int) -> float:
    b = t.subscription(
        SubscriptionSpec(target=subject, group=group, member="m", prefetch=prefetch, from_beginning=True)
    )
    started = time.perf_counter()
    await b.start()
    got = 0
    try:
        while got < count:
            for m in await b.receive(batch, 5.0):
                await m.ack()
                got += 1
        return time.perf_counter() - started
    finally:
        await b.stop()


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--shards", type=int, default=1)
    args = ap.parse_args()
    url = os.environ.get("OUTRELAY_NATS_URL", "nats://127.0.0.1:4222")
    tag = uuid.uuid4().hex[:8]
    stream, prefix = f"BENCH_SUB_{tag}".upper(), f"bench.sub.{tag}"
    nc = await nats.connect(url)
    await nc.jetstream().add_stream(name=stream, subjects=[f"{prefix}.>"], storage=nats.js.api.StorageType.MEMORY)
    cfg = NatsConfig(servers=(url,), subject=prefix + ".{stream}", expected_stream=stream, group_shards=args.shards)
    t = NatsTransport(cfg)
    await t.open()
    try:
        payload = b"x" * args.size
        evs = [Event(type="bench", stream=f"s{i % args.streams}", data=payload) for i in range(args.count)]
        for lo in range(0, len(evs), 1000):
            await t.send([Message(e, t.target(e), e.stream) for e in evs[lo : lo + 1000]])
        target = prefix + ".>"
        a = await raw(url, stream, target, args.count, args.batch)
        group = f"bench_{tag}"
        b = await backend(t, target, group, args.count, args.batch, prefetch=args.batch * 4)
        c = await bus_consume(t, args.count, target=target, prefetch=args.batch * 4)
        a2 = await raw(url, stream, target, args.count, args.batch)
        ra = (args.count / a + args.count / a2) / 2
        print(f"raw nats-py pull consumer: {ra:10.0f} ev/s (mean of {args.count / a:,.0f} and {args.count / a2:,.0f})")
        print(f"outrelay group backend:    {args.count / b:10.0f} ev/s ({args.shards} shards, one member)")
        print(f"ratio backend/raw:         {(args.count / b) / ra:10.2f}")
        print(f"EventBus group member:     {args.count / c:10.0f} ev/s (decode + runtime + handler)")
        print(f"ratio EventBus/raw:        {(args.count / c) / ra:10.2f}")
    finally:
        await t.close()
        js = nc.jetstream()
        await js.delete_stream(stream)
        with contextlib.suppress(nats.js.errors.NotFoundError):  # the group's lease bucket
            await js.delete_key_value(names(stream, prefix + ".>", f"bench_{tag}", args.shards)[0])
        await nc.close()


if __name__ == "__main__":
    asyncio.run(main())
