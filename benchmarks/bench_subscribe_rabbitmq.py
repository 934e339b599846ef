"""Consuming throughput on RabbitMQ: the rabbitmq subscription backend next to raw aio-pika, same broker, same run.

    .venv/bin/python benchmarks/bench_subscribe_rabbitmq.py [--count 20000] [--streams 100] [--size 1024]

Uses ``OUTRELAY_RABBITMQ_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``).
A fresh topic exchange gets, before anything is published, two plain durable
queues for the raw client (timed before and after the backend, as in
``_ratio.py``) and the backend's group (``--shards`` shard queues behind a
consistent-hash exchange, or with ``--shards 1`` one single-active-consumer
queue). ``--count`` 1 KB events
over ``--streams`` streams are then published once through the rabbitmq
transport (untimed), so each queue holds the same messages. Timed, each
reading and acking all of them with the same prefetch:

* raw:     aio-pika's idiomatic loop, ``async with queue.iterator()`` and
           ``await message.ack()`` per message (no decoding);
* backend: ``transport.subscription(SubscriptionSpec(group=...))``, a group of
           one member: ``receive(prefetch, 1.0)`` and ``await inbound.ack()``
           per message (including the CloudEvent decoding into an Event).

Queues and exchange are deleted at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid

import aio_pika

from outrelay import Delivered, Event, Message
from outrelay.core.contract.subscription import SubscriptionSpec
from outrelay.transports.rabbitmq._config import RabbitMQConfig
from outrelay.transports.rabbitmq._subscriber import group_queue
from outrelay.transports.rabbitmq._transport import RabbitMQTransport

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _bus import bus_consume
from _ratio import ratio, raw_line


def config(url: str, exchange: str, shards: int) -> RabbitMQConfig:
    return RabbitMQConfig(url=url, exchange=exchange, routing_key="s.{stream}", group_shards=shards)


async def prepare(url: str, exchange: str, raw_queues: list[str], groups: list[str], args: argparse.Namespace) -> None:
    """Declare the exchange and queues, then publish the events once (routed to every queue)."""
    conn = await aio_pika.connect(url)
    async with conn:
        channel = await conn.channel()
        ex = await channel.declare_exchange(exchange, "topic")
        for name in raw_queues:
            q = await channel.declare_queue(name, durable=True)
            await q.bind(ex, "#")
    t = RabbitMQTransport(config(url, exchange, args.shards))
    for group in groups:
        member = t.subscription(SubscriptionSpec("", group=group))
        await member.start()  # declares and binds the group queue, which then keeps what follows
        await member.stop()
    payload = b"x" * args.size
    events = [Event(type="bench.subscribe", stream=f"s{i % args.streams}", data=payload) for i in range(args.count)]
    await t.open()
    try:
        for lo in range(0, len(events), 1000):
            batch = [Message(e, t.target(e), e.stream) for e in events[lo : lo + 1000]]
            assert all(isinstance(r, Delivered) for r in await t.send(batch))
    finally:
        await t.close()


async def raw(url: str, queue: str, n: int, prefetch: int) -> float:
    conn = await aio_pika.connect(url)
    async with conn:
        channel = await conn.channel()
        await channel.set_qos(prefetch_count=prefetch)
        q = await channel.get_queue(queue)
        got = 0
        started = time.perf_counter()
        async with q.iterator() as messages:
            async for message in messages:
                await message.ack()
                got += 1
                if got == n:
                    break
        return time.perf_counter() - started


async def backend(url: str, exchange: str, group: str, n: int, prefetch: int, shards: int) -> float:
    t = RabbitMQTransport(config(url, exchange, shards))
    member = t.subscription(SubscriptionSpec("", group=group, prefetch=prefetch))
    started = time.perf_counter()
    await member.start()
    got = 0
    try:
        while got < n:
            for inbound in await member.receive(prefetch, 1.0):
                assert inbound.received is not None
                await inbound.ack()
                got += 1
        return time.perf_counter() - started
    finally:
        await member.stop()


async def cleanup(url: str, exchanges: list[str], queues: list[str]) -> None:
    conn = await aio_pika.connect(url)
    async with conn:
        for name in queues:
            channel = await conn.channel()
            await channel.queue_delete(name)
        for name in exchanges:
            channel = await conn.channel()
            await channel.exchange_delete(name)


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--shards", type=int, default=16, help="group_shards of the backend's group (1: single queue)")
    ap.add_argument("--prefetch", type=int, default=256, help="basic.qos for both (SubscriptionSpec's default)")
    args = ap.parse_args()

    url = os.environ.get("OUTRELAY_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    tag = uuid.uuid4().hex[:8]
    exchange, group, bus_group = f"bench-sub-{tag}", f"bench-{tag}", f"bench-bus-{tag}"
    raw_queues = [f"bench-sub-raw1-{tag}", f"bench-sub-raw2-{tag}"]
    n = args.count
    try:
        t0 = time.perf_counter()
        await prepare(url, exchange, raw_queues, [group, bus_group], args)
        t_pub = time.perf_counter() - t0
        t_raw = await raw(url, raw_queues[0], n, args.prefetch)
        t_backend = await backend(url, exchange, group, n, args.prefetch, args.shards)
        bus_t = RabbitMQTransport(config(url, exchange, args.shards))
        t_bus = await bus_consume(bus_t, n, prefetch=args.prefetch * 4, group=bus_group)
        t_raw2 = await raw(url, raw_queues[1], n, args.prefetch)
    finally:
        bases = [group_queue(g, exchange) for g in (group, bus_group)]
        extra = [f"{b}.{i}" for b in bases for i in range(args.shards)] + [f"{b}.members" for b in bases]
        shard_queues = extra if args.shards > 1 else []
        await cleanup(url, [*bases, exchange], [*raw_queues, *bases, *shard_queues])
    where = url.split("@")[-1]
    print(f"rabbitmq @ {where}, {n} events x {args.size} B, {args.streams} streams, prefetch {args.prefetch}")
    print(f"  (published once to 4 queues, untimed: {t_pub:.1f} s)")
    raw_mean = raw_line(n, t_raw, t_raw2).replace("the relay", "the backend")
    print(f"  a) raw aio-pika queue.iterator + ack     : {raw_mean}")
    what = f"{args.shards} shards" if args.shards > 1 else "single active consumer"
    took = f"{t_backend:.2f} s, incl. start; {what}"
    print(f"  b) rabbitmq backend receive + ack (group): {n / t_backend:10.0f} ev/s ({took})")
    print(f"  ratio b/a                                : {ratio(n, t_backend, t_raw, t_raw2):10.2f}")
    print(f"  c) EventBus group member (decode+runtime): {n / t_bus:10.0f} ev/s")
    print(f"  ratio c/a                                : {ratio(n, t_bus, t_raw, t_raw2):10.2f}")


if __name__ == "__main__":
    asyncio.run(main())
