"""Relay throughput SQLite -> RabbitMQ next to raw aio-pika with confirms, same broker, same run.

    .venv/bin/python benchmarks/bench_rabbitmq.py [--count 100000] [--streams 100] [--size 1024] [--queue-type quorum]

Uses ``OUTRELAY_RABBITMQ_URL`` (default ``amqp://guest:guest@127.0.0.1:5672/``).
Each run declares a fresh topic exchange bound to one queue capped with
``x-max-length`` (drop-head, so broker memory stays bounded), deleted at the
end; ``--queue-type quorum`` makes it a quorum queue (the replicated type;
one node here). Prints events/s for:

* raw:   one confirm channel, ``exchange.publish(mandatory=True)`` pipelined
         in windows of ``--window`` (all confirms awaited), the same 1 KB
         persistent messages with the same cloudEvents_* headers (built before the clock starts,
         as in bench_kafka, unless ``--encode-in-raw``);
* relay: ``outrelay.Relay(drain=True)`` from a SQLite outbox holding the
         events (append time excluded) through the rabbitmq transport;
* engine ceiling: the same relay run into the in-process ``memory`` transport.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid

import aio_pika

from outrelay import Event
from outrelay.core.model import cloudevents

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _ratio import cpu_line, ratio, raw_line, record_cpu
from bench_nats import relay


def make_events(count: int, streams: int, size: int) -> list[Event]:
    payload = b"x" * size
    return [Event(type="bench.rabbitmq", stream=f"s{i % streams}", data=payload) for i in range(count)]


async def declare(url: str, queue_type: str = "classic") -> tuple[str, str]:
    tag = uuid.uuid4().hex[:8]
    exchange, queue = f"bench-{tag}", f"bench-{tag}"
    conn = await aio_pika.connect(url)
    async with conn:
        channel = await conn.channel()
        ex = await channel.declare_exchange(exchange, "topic")
        arguments = {"x-max-length": 10_000, "x-overflow": "drop-head", "x-queue-type": queue_type}
        q = await channel.declare_queue(queue, durable=queue_type == "quorum", arguments=arguments)
        await q.bind(ex, "#")
    return exchange, queue


async def delete(url: str, exchange: str, queue: str) -> None:
    conn = await aio_pika.connect(url)
    async with conn:
        channel = await conn.channel()
        await channel.queue_delete(queue)
        await channel.exchange_delete(exchange)


async def raw(url: str, exchange: str, events: list[Event], window: int, encode_inside: bool = False) -> float:
    conn = await aio_pika.connect(url)
    async with conn:
        channel = await conn.channel(publisher_confirms=True, on_return_raises=True)
        ex = await channel.get_exchange(exchange)
        started, cpu = time.perf_counter(), time.process_time()
        msgs = [
            (
                aio_pika.Message(
                    e.data,
                    headers=cloudevents.binary_headers(e, prefix="cloudEvents_"),  # type: ignore[arg-type]
                    content_type=e.content_type,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    message_id=e.id,
                    timestamp=e.time,
                    type=e.type,
                ),
                f"s.{e.stream}",
            )
            for e in events
        ]
        if not encode_inside:  # like bench_kafka: building the messages is not timed
            started, cpu = time.perf_counter(), time.process_time()
        for lo in range(0, len(msgs), window):
            await asyncio.gather(*(ex.publish(m, rk, mandatory=True) for m, rk in msgs[lo : lo + window]))
        record_cpu("raw", cpu)
        return time.perf_counter() - started


async def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--per-stream", type=int, default=16, help="relay: events of one stream per batch (config default)")
    ap.add_argument("--window", type=int, default=1000, help="raw client: publishes in flight before awaiting")
    ap.add_argument(
        "--strict", action="store_true", help="relay with pipeline = false (one unacked message per stream)"
    )
    ap.add_argument("--encode-in-raw", action="store_true", help="time the raw client's message building too")
    ap.add_argument("--no-ceiling", action="store_true", help="skip the memory-transport engine run")
    ap.add_argument("--queue-type", choices=["classic", "quorum"], default="classic", help="the bound queue's type")
    args = ap.parse_args()

    url = os.environ.get("OUTRELAY_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
    events = make_events(args.count, args.streams, args.size)
    n = len(events)
    exchange, queue = await declare(url, args.queue_type)
    try:
        t_raw = await raw(url, exchange, events, args.window, args.encode_in_raw)
        dest = {
            "transport": "rabbitmq",
            "url": url,
            "exchange": exchange,
            "routing_key": "s.{stream}",
            "pipeline": not args.strict,
        }
        t_relay = await relay(dest, events, args.batch_size, args.in_flight, args.per_stream)
        t_raw2 = await raw(url, exchange, events, args.window, args.encode_in_raw)
    finally:
        await delete(url, exchange, queue)
    print(
        f"rabbitmq @ {url.split('@')[-1]}, {n} events x {args.size} B, {args.streams} streams, confirms, persistent, "
        f"{args.queue_type} queue"
    )
    what = "incl. encoding" if args.encode_in_raw else "pre-encoded"
    print(f"  raw aio-pika publish pipelined (confirms): {raw_line(n, t_raw, t_raw2)}, {what}")
    print(f"  outrelay relay -> rabbitmq               : {n / t_relay:10.0f} ev/s ({t_relay:.2f} s)")
    print(
        f"  relay settings: pipeline={not args.strict} batch_size={args.batch_size} "
        f"per_stream={args.per_stream} max_in_flight={args.in_flight}"
    )
    print(f"  ratio relay/raw                          : {ratio(n, t_relay, t_raw, t_raw2):10.2f}")
    if not args.no_ceiling:
        t_mem = await relay({"transport": "memory"}, events, args.batch_size, args.in_flight, args.per_stream)
        print(f"  engine ceiling (relay->memory)           : {n / t_mem:10.0f} ev/s ({t_mem:.2f} s)")
    print(f"  {cpu_line(n)}")


if __name__ == "__main__":
    asyncio.run(main())
