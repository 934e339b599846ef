"""outrelay vs faststream-outbox: PostgreSQL outbox -> RabbitMQ, same database, same broker, same run.

    .venv/bin/python benchmarks/bench_postgres_vs_faststream_outbox.py [--count 20000] [--streams 100] [--size 1024]

Setup (not a project dependency; nothing goes into pyproject.toml)::

    .venv/bin/pip install --dry-run "faststream-outbox[asyncpg]" "faststream[rabbit]"  # checked: adds only
    .venv/bin/pip install "faststream-outbox[asyncpg]" "faststream[rabbit]"            # faststream-outbox 0.19.0,
                                                                                        # faststream 0.7.8,
                                                                                        # fast-depends, asyncpg

Without faststream-outbox the script prints one line and exits 2.

What is measured, for each side, ``--rounds`` times interleaved (outrelay,
faststream-outbox, outrelay, ...), medians printed:

* a fresh PostgreSQL schema (``OUTRELAY_POSTGRES_URL``, default
  ``postgresql://postgres@127.0.0.1:5432/test``) and a fresh durable topic
  exchange + queue on RabbitMQ (``OUTRELAY_RABBITMQ_URL``, default
  ``amqp://guest:guest@127.0.0.1:5672/``), both deleted afterwards;
* the relay under test runs in a child process of its own (``--child``), so
  it does not share a GIL with the producer/consumer; it is started, then
  warmed with one event that must reach the consumer (connections, channels
  and LISTEN are up before the clock starts);
* the parent appends ``--count`` events of ``--size`` bytes over ``--streams``
  streams (round-robin, so events of one stream interleave with all others)
  in ONE transaction through each library's own transactional API
  (``Outbox.append(events, conn=psycopg_conn)`` / ``OutboxBroker.publish_batch(
  *bodies, queue=..., session=AsyncSession)``); the clock starts when COMMIT
  returns and stops when an aio-pika consumer (prefetch 5000, no-ack) on the
  queue has received every event at least once;
* the body of every event is ``b"<stream>:<seq>|"`` padded to ``--size``; the
  consumer counts duplicates and out-of-order pairs per stream (a received
  event whose per-stream seq is lower than one already received).

Configuration (printed with the results):

* outrelay: ``Outbox.open(url?schema=...)`` (PostgreSQL store defaults:
  pool_size 4, notify on), ``Relay`` with destination ``{"transport":
  "rabbitmq", "exchange": ..., "routing_key": "s.{stream}", "batch_size":
  --or-batch-size}``, everything else default (max_in_flight 4, per_stream
  16, persistent messages, publisher confirms, mandatory).
* faststream-outbox: the documented relay shape (``@rabbit.publisher(...)``
  stacked on ``@outbox.subscriber(queue, ...)``, handler returns the body),
  asyncpg driver (LISTEN/NOTIFY wake-ups), subscriber knobs from its docs'
  high-throughput example and performance page: ``max_workers``
  (--fso-workers), ``fetch_batch_size`` (--fso-fetch), ``min_fetch_interval
  0.1``, ``max_fetch_interval 1.0``, ``lease_ttl_seconds 120``,
  ``terminal_flush_batch_size`` (--fso-flush; batched terminal DELETEs),
  engine pool sized max_workers + 4; RabbitMQ publisher ``persist=True`` (as
  outrelay's persistent messages) with FastStream's defaults (publisher
  confirms, mandatory).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

PG_URL = os.environ.get("OUTRELAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MQ_URL = os.environ.get("OUTRELAY_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
FSO_QUEUE = "bench"
WARM_STREAM = 999_999  # the warm-up event's stream number; not counted


def body(stream: int, seq: int, size: int) -> bytes:
    head = f"{stream}:{seq}|".encode()
    return head + b"x" * max(0, size - len(head))


def pg_sqlalchemy_url(schema: str) -> str:
    """``postgresql://...`` -> ``postgresql+asyncpg://...`` (faststream-outbox's documented driver)."""
    rest = PG_URL.split("://", 1)[1]
    return f"postgresql+asyncpg://{rest}"


def with_schema(schema: str) -> str:
    return f"{PG_URL}{'&' if '?' in PG_URL else '?'}schema={schema}"


# --------------------------------------------------------------------------- consumer side


@dataclass
class Received:
    """What the consumer saw; per-stream order is judged on arrival order."""

    want: int
    seen: set[tuple[int, int]] = field(default_factory=set)
    last: dict[int, int] = field(default_factory=dict)
    duplicates: int = 0
    out_of_order: int = 0
    warm: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    done_at: float = 0.0

    def on_body(self, data: bytes) -> None:
        head = data[: data.index(b"|")]
        s, _, q = head.partition(b":")
        stream, seq = int(s), int(q)
        if stream == WARM_STREAM:
            self.warm.set()
            return
        key = (stream, seq)
        if key in self.seen:
            self.duplicates += 1
            return
        self.seen.add(key)
        prev = self.last.get(stream, -1)
        if seq < prev:
            self.out_of_order += 1
        else:
            self.last[stream] = seq
        if len(self.seen) == self.want and not self.done.is_set():
            self.done_at = time.perf_counter()
            self.done.set()


async def consume(queue_name: str, rec: Received) -> Callable[[], Awaitable[None]]:
    """Start an aio-pika consumer on ``queue_name``; returns an async closer."""
    import aio_pika

    conn = await aio_pika.connect(MQ_URL)
    channel = await conn.channel()
    await channel.set_qos(prefetch_count=5000)
    queue = await channel.get_queue(queue_name)

    async def on_message(msg: aio_pika.abc.AbstractIncomingMessage) -> None:
        rec.on_body(msg.body)

    tag = await queue.consume(on_message, no_ack=True)

    async def close() -> None:
        with contextlib.suppress(Exception):
            await queue.cancel(tag)
        await conn.close()

    return close


async def declare_mq(tag: str) -> tuple[str, str]:
    import aio_pika

    exchange, queue = f"bench-fso-{tag}", f"bench-fso-{tag}"
    conn = await aio_pika.connect(MQ_URL)
    async with conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        q = await ch.declare_queue(queue, durable=True)
        await q.bind(ex, "#")
    return exchange, queue


async def delete_mq(exchange: str, queue: str) -> None:
    import aio_pika

    conn = await aio_pika.connect(MQ_URL)
    async with conn:
        ch = await conn.channel()
        await ch.queue_delete(queue)
        await ch.exchange_delete(exchange)


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# --------------------------------------------------------------------------- producer side (parent)


def outrelay_prepare(schema: str) -> Any:
    from outrelay import Outbox

    return Outbox.open(with_schema(schema))  # creates the schema and tables (migrate on open)


def outrelay_append(outbox: Any, rows: list[tuple[int, int]], size: int) -> None:
    import psycopg

    from outrelay import Event

    events = [Event(type="bench.fso", stream=f"s{s}", data=body(s, q, size)) for s, q in rows]
    with psycopg.connect(PG_URL) as conn:
        with conn.transaction():
            outbox.append(events, conn=conn)


async def fso_prepare(schema: str, table: str) -> None:
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine

    from faststream_outbox import make_outbox_table

    engine = create_async_engine(pg_sqlalchemy_url(schema))
    md = MetaData(schema=schema)
    make_outbox_table(md, table_name=table)
    async with engine.begin() as conn:
        await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        await conn.run_sync(md.create_all)
    await engine.dispose()


async def fso_append(schema: str, table: str, rows: list[tuple[int, int]], size: int) -> None:
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    from faststream_outbox import OutboxBroker, make_outbox_table

    engine = create_async_engine(pg_sqlalchemy_url(schema))
    outbox = OutboxBroker(engine, outbox_table=make_outbox_table(MetaData(schema=schema), table_name=table))
    try:
        async with AsyncSession(engine) as session, session.begin():
            for lo in range(0, len(rows), 1000):
                bodies = [body(s, q, size) for s, q in rows[lo : lo + 1000]]
                await outbox.publish_batch(*bodies, queue=FSO_QUEUE, session=session)
    finally:
        await engine.dispose()


# --------------------------------------------------------------------------- relays (child process)


async def child_outrelay(opts: dict[str, Any], stop: asyncio.Event) -> None:
    from outrelay import Outbox, Relay, parse_config

    cfg = parse_config(
        {
            "outbox": {"url": with_schema(opts["schema"])},
            "destinations": {
                "mq": {
                    "transport": "rabbitmq",
                    "url": MQ_URL,
                    "exchange": opts["exchange"],
                    "routing_key": "s.{stream}",
                    "batch_size": opts["batch_size"],
                }
            },
        }
    )
    relay = Relay(Outbox.open(with_schema(opts["schema"])), cfg)
    task = asyncio.create_task(relay.run())
    await asyncio.sleep(0.5)
    print("READY", flush=True)
    await stop.wait()
    relay.stop()
    await task
    relay.outbox.close()


async def child_fso(opts: dict[str, Any], stop: asyncio.Event) -> None:
    import logging

    from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine

    from faststream_outbox import OutboxBroker, make_outbox_table

    workers = opts["workers"]
    engine = create_async_engine(pg_sqlalchemy_url(opts["schema"]), pool_size=workers + 4, max_overflow=4)
    table = make_outbox_table(MetaData(schema=opts["schema"]), table_name=opts["table"])
    # logging off on both sides: FastStream logs every message at INFO by default, outrelay does not
    outbox = OutboxBroker(engine, outbox_table=table, log_level=logging.WARNING)
    rabbit = RabbitBroker(MQ_URL, log_level=logging.WARNING)
    exchange = RabbitExchange(opts["exchange"], type=ExchangeType.TOPIC, durable=True, declare=False)
    publisher = rabbit.publisher(exchange=exchange, routing_key="fso", persist=True)

    @publisher
    @outbox.subscriber(
        FSO_QUEUE,
        max_workers=workers,
        fetch_batch_size=opts["fetch"],
        min_fetch_interval=0.1,
        max_fetch_interval=1.0,
        lease_ttl_seconds=120.0,
        terminal_flush_batch_size=opts["flush"],
    )
    async def relay(payload: bytes) -> bytes:
        return payload

    await rabbit.start()
    await outbox.start()
    await asyncio.sleep(0.5)
    print("READY", flush=True)
    await stop.wait()
    await outbox.stop()
    await rabbit.stop()
    await engine.dispose()


def child_main(side: str, raw: str) -> None:
    opts = json.loads(raw)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        await (child_outrelay if side == "outrelay" else child_fso)(opts, stop)

    asyncio.run(run())


# --------------------------------------------------------------------------- one measured run


@dataclass
class Result:
    side: str
    seconds: float
    received: int
    duplicates: int
    out_of_order: int

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0


async def start_child(side: str, opts: dict[str, Any]) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--child", side, json.dumps(opts)],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 60)
    if line.strip() != b"READY":
        proc.kill()
        raise RuntimeError(f"{side} relay did not start (exit {proc.wait()})")
    return proc


async def stop_child(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(asyncio.to_thread(proc.wait), 30)
    except TimeoutError:
        proc.kill()
        proc.wait()


async def one_run(side: str, args: argparse.Namespace) -> Result:
    tag = uuid.uuid4().hex[:8]
    schema, table = f"bench_fso_{tag}", f"outbox_{tag}"
    rows = [(i % args.streams, i // args.streams) for i in range(args.count)]
    exchange, queue = await declare_mq(tag)
    rec = Received(want=args.count)
    close_consumer = await consume(queue, rec)
    proc = None
    outbox = None
    try:
        opts: dict[str, Any] = {"schema": schema, "table": table, "exchange": exchange}
        if side == "outrelay":
            outbox = outrelay_prepare(schema)
            opts["batch_size"] = args.or_batch_size
            proc = await start_child(side, opts)
            append: Callable[[list[tuple[int, int]]], Awaitable[None]] = lambda r: asyncio.to_thread(
                outrelay_append, outbox, r, args.size
            )
        else:
            await fso_prepare(schema, table)
            opts.update(workers=args.fso_workers, fetch=args.fso_fetch, flush=args.fso_flush)
            proc = await start_child(side, opts)
            append = lambda r: fso_append(schema, table, r, args.size)  # noqa: E731
        await append([(WARM_STREAM, 0)])
        await asyncio.wait_for(rec.warm.wait(), 30)
        await append(rows)
        started = time.perf_counter()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rec.done.wait(), args.timeout)
        ended = rec.done_at if rec.done.is_set() else time.perf_counter()
        await asyncio.sleep(0.3)  # late duplicates / stragglers still count in the order check
        return Result(side, ended - started, len(rec.seen), rec.duplicates, rec.out_of_order)
    finally:
        if proc is not None:
            await stop_child(proc)
        await close_consumer()
        if outbox is not None:
            outbox.close()
        await delete_mq(exchange, queue)
        drop_schema(schema)


async def main(args: argparse.Namespace) -> None:
    sides = ["outrelay", "faststream-outbox"]
    results: dict[str, list[Result]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else reversed(sides):
            res = await one_run(side, args)
            results[side].append(res)
            print(
                f"  round {r + 1} {side:18s}: {res.rate:8.0f} ev/s ({res.seconds:6.2f} s, "
                f"{res.received}/{args.count} received, {res.duplicates} dup, {res.out_of_order} out-of-order)",
                flush=True,
            )
    med = {s: statistics.median(x.rate for x in results[s]) for s in sides}
    print(
        f"PostgreSQL -> RabbitMQ ({MQ_URL.split('@')[-1]}), {args.count} events x {args.size} B, "
        f"{args.streams} streams, one commit; consumer-side, median of {args.rounds}"
    )
    print(f"  outrelay          : {med['outrelay']:8.0f} ev/s  (batch_size={args.or_batch_size}, other options default)")
    print(
        f"  faststream-outbox : {med['faststream-outbox']:8.0f} ev/s  (max_workers={args.fso_workers}, "
        f"fetch_batch_size={args.fso_fetch}, terminal_flush_batch_size={args.fso_flush}, asyncpg)"
    )
    for s in sides:
        ooo = [x.out_of_order for x in results[s]]
        dup = [x.duplicates for x in results[s]]
        lost = [args.count - x.received for x in results[s]]
        print(f"  {s:18s}: out-of-order pairs per run {ooo}, duplicates {dup}, missing {lost}")
    ratio = med["outrelay"] / med["faststream-outbox"] if med["faststream-outbox"] else float("inf")
    print(f"  ratio outrelay / faststream-outbox: {ratio:.2f}x (target >= 2x with per-stream order)")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3, help="runs per side, interleaved; medians printed")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds one run may take before it is cut")
    ap.add_argument("--or-batch-size", type=int, default=1000, help="outrelay destination batch_size")
    ap.add_argument("--fso-workers", type=int, default=8, help="faststream-outbox max_workers")
    ap.add_argument("--fso-fetch", type=int, default=100, help="faststream-outbox fetch_batch_size")
    ap.add_argument("--fso-flush", type=int, default=100, help="faststream-outbox terminal_flush_batch_size")
    return ap.parse_args()


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_main(sys.argv[2], sys.argv[3])
        sys.exit(0)
    if importlib.util.find_spec("faststream_outbox") is None or importlib.util.find_spec("faststream.rabbit") is None:
        print('faststream-outbox is not installed: .venv/bin/pip install "faststream-outbox[asyncpg]" "faststream[rabbit]"')
        sys.exit(2)
    asyncio.run(main(parse_args()))
