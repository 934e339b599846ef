"""outrelay vs faststream-outbox: one PostgreSQL outbox -> NATS JetStream or RabbitMQ, same run.

    .venv/bin/python benchmarks/bench_postgres_vs_faststream_outbox.py [--broker nats|rabbitmq]
        [--count 20000] [--streams 100] [--size 1024] [--rounds 3] [--processes 1] [--burst 1]
    .venv/bin/python benchmarks/bench_postgres_vs_faststream_outbox.py --rate 200 [--seconds 10] [--rounds 3]

Setup (not a project dependency; nothing goes into pyproject.toml)::

    .venv/bin/pip install --dry-run "faststream-outbox[asyncpg]" "faststream[rabbit,nats]"  # checked: only adds
    .venv/bin/pip install "faststream-outbox[asyncpg]" "faststream[rabbit,nats]"
    # -> faststream-outbox 0.19.0, faststream 0.7.8, fast-depends 3.0.9, asyncpg 0.32.0; nothing replaced

Without faststream-outbox the script prints one line and exits 2.

The default broker is NATS JetStream: FastStream supports both, and
faststream-outbox is faster on NATS (about 2x its RabbitMQ rate here), so
it is the broker where it does best. ``--broker rabbitmq`` runs the same
comparison on RabbitMQ (persistent messages, publisher confirms).

What is measured, for each side, ``--rounds`` times interleaved (outrelay,
faststream-outbox, outrelay, ...), medians printed:

* a fresh PostgreSQL schema (``OUTRELAY_POSTGRES_URL``, default
  ``postgresql://postgres@127.0.0.1:5432/test``) and either a fresh
  file-storage JetStream stream (``OUTRELAY_NATS_URL``, default
  ``nats://127.0.0.1:4222``) or a fresh durable topic exchange + queue on
  RabbitMQ (``OUTRELAY_RABBITMQ_URL``, default
  ``amqp://guest:guest@127.0.0.1:5672/``), all deleted afterwards;
* the relay under test runs in a child process of its own (``--child``), so
  it does not share a GIL with the producer/consumer; it is started, then
  warmed with one event that must reach the consumer (connections, channels
  and LISTEN are up before the clock starts);
* the parent appends ``--count`` events of ``--size`` bytes over ``--streams``
  streams (round-robin; ``--burst N``: N consecutive events of a stream per
  turn) in ONE transaction through each library's own transactional API
  (``Outbox.append(events, conn=psycopg_conn)`` / ``OutboxBroker.publish_batch(
  *bodies, queue=..., session=AsyncSession)``); the clock starts when COMMIT
  returns and stops when a consumer on the broker (NATS: JetStream ordered
  push consumer on the stream; RabbitMQ: aio-pika, prefetch 5000, no-ack)
  has received every event at least once; the relay process's CPU seconds
  in that window are printed too (Linux /proc);
* the body of every event is ``b"<stream>:<seq>|"`` padded to ``--size``; the
  consumer counts duplicates and out-of-order pairs per stream (a received
  event whose per-stream seq is lower than one already received).

Configuration (printed with the results):

* outrelay: ``Outbox.open(url?schema=...)`` (PostgreSQL store defaults:
  pool_size 4, notify on), ``Relay`` with one destination, ``batch_size``
  --or-batch-size (1000) and everything else default (max_in_flight 4,
  per_stream 16, retry defaults): NATS ``{"transport": "nats", "subject":
  "<prefix>.{stream}", "expected_stream": ...}`` (JetStream acks,
  Nats-Msg-Id); RabbitMQ ``{"transport": "rabbitmq", "exchange": ...,
  "routing_key": "s.{stream}"}`` (persistent, publisher confirms, mandatory).
* faststream-outbox: the documented relay shape (``@rabbit.publisher(...)``
  stacked on ``@outbox.subscriber(queue, ...)``, handler returns the body),
  asyncpg driver (LISTEN/NOTIFY wake-ups), subscriber knobs from its docs'
  high-throughput example and performance page: ``max_workers``
  (--fso-workers), ``fetch_batch_size`` (--fso-fetch), ``min_fetch_interval
  0.1``, ``max_fetch_interval 1.0``, ``lease_ttl_seconds 120``,
  ``terminal_flush_batch_size`` (--fso-flush; batched terminal DELETEs),
  engine pool sized max_workers + 4; NATS publisher with
  ``stream=JStream(name, declare=False)`` (publishes through JetStream and
  awaits each ack); RabbitMQ publisher ``persist=True`` (as outrelay's
  persistent messages) with FastStream's defaults (publisher confirms,
  mandatory); ``logger=None`` on both FastStream brokers (they log
  two lines per message by default, outrelay none).
* ``--processes N`` starts N relay processes per side on the same outbox
  (both libraries' documented way to scale out).

``--rate R`` (latency at a trickle): instead of one commit of ``--count``
events, the parent appends R events per second for ``--seconds``, one event
per transaction (``Outbox.append(event, conn=...)`` / ``publish(..., session=
...)``), and prints per side the commit -> consumer latency (p50, p99) and the
relay process's CPU (share of a core, µs per event) from the first append to
the last arrival. Three sides by default: outrelay with its defaults,
faststream-outbox with the knobs above, and faststream-outbox with its own
defaults (``max_workers`` 1, ``fetch_batch_size`` 10, fetch intervals 1-10 s,
``terminal_flush_batch_size`` 1); the last line compares outrelay with the
peer's best p50 and best CPU (target: at most theirs).

Reading the order figures: one faststream-outbox process publishes in the
order its workers dequeue rows over one channel, so on the happy path it shows
no reordering; it has no per-stream ordering (no stream notion at all), and
reordering appears once work is spread (``--processes 2``) or rows are
retried. outrelay keeps per-stream order in every mode.
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
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from _cpu import stat_cpu

PG_URL = os.environ.get("OUTRELAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")
MQ_URL = os.environ.get("OUTRELAY_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672/")
NATS_URL = os.environ.get("OUTRELAY_NATS_URL", "nats://127.0.0.1:4222")
FSO_QUEUE = "bench"
FSO_DEFAULTS = "faststream-outbox-defaults"
SIDES = ("outrelay", "faststream-outbox", FSO_DEFAULTS)
SELF = os.path.abspath(__file__)
INSTALL = '"faststream-outbox[asyncpg]" "faststream[rabbit,nats]"'
WARM_STREAM = 999_999  # the warm-up event's stream number; not counted


def body(stream: int, seq: int, size: int) -> bytes:
    head = f"{stream}:{seq}|".encode()
    return head + b"x" * max(0, size - len(head))


def pg_sqlalchemy_url() -> str:
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
    #: perf_counter() of each event's first arrival (latency mode)
    arrived: dict[tuple[int, int], float] = field(default_factory=dict)

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
        self.arrived[key] = time.perf_counter()
        prev = self.last.get(stream, -1)
        if seq < prev:
            self.out_of_order += 1
        else:
            self.last[stream] = seq
        if len(self.seen) == self.want and not self.done.is_set():
            self.done_at = time.perf_counter()
            self.done.set()


async def rabbit_consume(queue_name: str, rec: Received) -> Callable[[], Awaitable[None]]:
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


async def rabbit_declare(tag: str) -> tuple[str, str]:
    import aio_pika

    exchange, queue = f"bench-fso-{tag}", f"bench-fso-{tag}"
    conn = await aio_pika.connect(MQ_URL)
    async with conn:
        ch = await conn.channel()
        ex = await ch.declare_exchange(exchange, aio_pika.ExchangeType.TOPIC, durable=True)
        q = await ch.declare_queue(queue, durable=True)
        await q.bind(ex, "#")
    return exchange, queue


async def rabbit_delete(exchange: str, queue: str) -> None:
    import aio_pika

    conn = await aio_pika.connect(MQ_URL)
    async with conn:
        ch = await conn.channel()
        await ch.queue_delete(queue)
        await ch.exchange_delete(exchange)


async def nats_consume(subject: str, rec: Received) -> Callable[[], Awaitable[None]]:
    """A JetStream ordered push consumer on ``subject.>`` (sees what the stream stored, in stream order)."""
    import nats

    nc = await nats.connect(NATS_URL)

    async def on_message(msg: Any) -> None:
        rec.on_body(msg.data)

    sub = await nc.jetstream().subscribe(f"{subject}.>", cb=on_message, ordered_consumer=True)

    async def close() -> None:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        await nc.close()

    return close


async def nats_declare(tag: str) -> tuple[str, str]:
    """A fresh file-storage stream ``BENCH_FSO_<tag>`` on ``bench-fso.<tag>.>``; returns (stream, subject)."""
    import nats
    import nats.js.api

    name, subject = f"BENCH_FSO_{tag}".upper(), f"bench-fso.{tag}"
    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().add_stream(
            name=name, subjects=[f"{subject}.>"], storage=nats.js.api.StorageType.FILE, duplicate_window=120
        )
    finally:
        await nc.close()
    return name, subject


async def nats_delete(name: str, subject: str) -> None:
    import nats

    nc = await nats.connect(NATS_URL)
    try:
        await nc.jetstream().delete_stream(name)
    finally:
        await nc.close()


async def declare_broker(broker: str, tag: str) -> tuple[str, str]:
    """(target, sink): RabbitMQ (exchange, queue) or NATS (stream, subject prefix)."""
    return await (rabbit_declare if broker == "rabbitmq" else nats_declare)(tag)


async def delete_broker(broker: str, target: str, sink: str) -> None:
    await (rabbit_delete if broker == "rabbitmq" else nats_delete)(target, sink)


async def consume(broker: str, sink: str, rec: Received) -> Callable[[], Awaitable[None]]:
    return await (rabbit_consume if broker == "rabbitmq" else nats_consume)(sink, rec)


def drop_schema(schema: str) -> None:
    import psycopg

    with psycopg.connect(PG_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


# --------------------------------------------------------------------------- producer side (parent)


def layout(count: int, streams: int, burst: int) -> list[tuple[int, int]]:
    """(stream, seq) in append order: streams take turns, ``burst`` consecutive events each."""
    rows: list[tuple[int, int]] = []
    seq = [0] * streams
    turn = 0
    while len(rows) < count:
        s = turn % streams
        for _ in range(min(burst, count - len(rows))):
            rows.append((s, seq[s]))
            seq[s] += 1
        turn += 1
    return rows


def outrelay_prepare(schema: str) -> Any:
    from outrelay import Outbox

    return Outbox.open(with_schema(schema))  # creates the schema and tables (migrate on open)


def outrelay_append(outbox: Any, rows: list[tuple[int, int]], size: int) -> None:
    import psycopg

    from outrelay import Event

    events = [Event(type="bench.fso", stream=f"s{s}", data=body(s, q, size)) for s, q in rows]
    with psycopg.connect(PG_URL) as conn, conn.transaction():
        outbox.append(events, conn=conn)


async def fso_prepare(schema: str, table: str) -> None:
    from faststream_outbox import make_outbox_table
    from sqlalchemy import MetaData, text
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(pg_sqlalchemy_url())
    md = MetaData(schema=schema)
    make_outbox_table(md, table_name=table)
    async with engine.begin() as conn:
        await conn.execute(text(f'CREATE SCHEMA IF NOT EXISTS "{schema}"'))
        await conn.run_sync(md.create_all)
    await engine.dispose()


async def fso_append(schema: str, table: str, rows: list[tuple[int, int]], size: int) -> None:
    from faststream_outbox import OutboxBroker, make_outbox_table
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(pg_sqlalchemy_url())
    outbox = OutboxBroker(engine, outbox_table=make_outbox_table(MetaData(schema=schema), table_name=table))
    try:
        async with AsyncSession(engine) as session, session.begin():
            for lo in range(0, len(rows), 1000):
                bodies = [body(s, q, size) for s, q in rows[lo : lo + 1000]]
                await outbox.publish_batch(*bodies, queue=FSO_QUEUE, session=session)
    finally:
        await engine.dispose()


def outrelay_trickle(outbox: Any, rows: list[tuple[int, int]], size: int, rate: float) -> dict[tuple[int, int], float]:
    """Append ``rows`` one event per transaction at ``rate`` per second (an application's psycopg
    connection); returns each event's commit time (perf_counter)."""
    import psycopg

    from outrelay import Event

    commits: dict[tuple[int, int], float] = {}
    with psycopg.connect(PG_URL) as conn:
        started = time.perf_counter()
        for i, (s, q) in enumerate(rows):
            ahead = started + i / rate - time.perf_counter()
            if ahead > 0:
                time.sleep(ahead)
            with conn.transaction():
                outbox.append([Event(type="bench.fso", stream=f"s{s}", data=body(s, q, size))], conn=conn)
            commits[(s, q)] = time.perf_counter()
    return commits


async def fso_trickle(
    schema: str, table: str, rows: list[tuple[int, int]], size: int, rate: float
) -> dict[tuple[int, int], float]:
    """:func:`outrelay_trickle` through faststream-outbox's ``publish(..., session=AsyncSession)``."""
    from faststream_outbox import OutboxBroker, make_outbox_table
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(pg_sqlalchemy_url())
    outbox = OutboxBroker(engine, outbox_table=make_outbox_table(MetaData(schema=schema), table_name=table))
    commits: dict[tuple[int, int], float] = {}
    try:
        started = time.perf_counter()
        for i, (s, q) in enumerate(rows):
            ahead = started + i / rate - time.perf_counter()
            if ahead > 0:
                await asyncio.sleep(ahead)
            async with AsyncSession(engine) as session, session.begin():
                await outbox.publish(body(s, q, size), queue=FSO_QUEUE, session=session)
            commits[(s, q)] = time.perf_counter()
    finally:
        await engine.dispose()
    return commits


# --------------------------------------------------------------------------- relays (child process)


def destination(opts: dict[str, Any]) -> dict[str, Any]:
    """outrelay's destination options for the broker under test (see the transports' _config.py)."""
    if opts["broker"] == "rabbitmq":
        return {"transport": "rabbitmq", "url": MQ_URL, "exchange": opts["target"], "routing_key": "s.{stream}"}
    return {
        "transport": "nats",
        "servers": [NATS_URL],
        "subject": opts["sink"] + ".{stream}",
        "expected_stream": opts["target"],
    }


async def child_outrelay(opts: dict[str, Any], stop: asyncio.Event) -> None:
    from outrelay import Outbox, Relay, parse_config

    cfg = parse_config(
        {
            "outbox": {"url": with_schema(opts["schema"])},
            "destinations": {
                "mq": {**destination(opts), "batch_size": opts["batch_size"]},
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
    from faststream.nats import JStream, NatsBroker
    from faststream.rabbit import ExchangeType, RabbitBroker, RabbitExchange
    from faststream_outbox import OutboxBroker, make_outbox_table
    from sqlalchemy import MetaData
    from sqlalchemy.ext.asyncio import create_async_engine

    workers = opts["workers"]
    engine = create_async_engine(pg_sqlalchemy_url(), pool_size=workers + 4, max_overflow=4)
    table = make_outbox_table(MetaData(schema=opts["schema"]), table_name=opts["table"])
    # per-message logging off: FastStream logs "Received"/"Processed" for every message by default,
    # outrelay logs nothing per event; logger=None is FastStream's documented way to turn it off
    outbox = OutboxBroker(engine, outbox_table=table, logger=None)
    foreign: Any
    publisher: Callable[[Any], Any]
    if opts["broker"] == "rabbitmq":
        foreign = RabbitBroker(MQ_URL, logger=None)
        exchange = RabbitExchange(opts["target"], type=ExchangeType.TOPIC, durable=True, declare=False)
        publisher = foreign.publisher(exchange=exchange, routing_key="fso", persist=True)
    else:
        foreign = NatsBroker(NATS_URL, logger=None)
        # stream= makes FastStream publish through JetStream and await each ack (as outrelay does)
        publisher = foreign.publisher(opts["sink"] + ".fso", stream=JStream(opts["target"], declare=False))

    @publisher
    @outbox.subscriber(
        FSO_QUEUE,
        max_workers=workers,
        fetch_batch_size=opts["fetch"],
        min_fetch_interval=opts.get("min_fetch_interval", 0.1),
        max_fetch_interval=opts.get("max_fetch_interval", 1.0),
        lease_ttl_seconds=opts.get("lease_ttl_seconds", 120.0),
        terminal_flush_batch_size=opts["flush"],
    )
    async def relay(payload: bytes) -> bytes:
        return payload

    await foreign.start()
    await outbox.start()
    await asyncio.sleep(0.5)
    print("READY", flush=True)
    await stop.wait()
    await outbox.stop()
    await foreign.stop()
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
    relay_cpu: float  # CPU seconds the relay process(es) used while the clock ran (Linux /proc; 0 elsewhere)
    latency_ms: list[float] = field(default_factory=list)  # commit -> first arrival of each event (--rate)

    def pct(self, p: float) -> float:
        lat = sorted(self.latency_ms)
        return lat[min(len(lat) - 1, int(len(lat) * p))] if lat else float("nan")

    @property
    def rate(self) -> float:
        return self.received / self.seconds if self.seconds else 0.0


def cpu_seconds(pids: list[int]) -> float:
    """user + system CPU seconds of ``pids`` so far, from /proc (0.0 where /proc is missing)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(OSError):
            total += stat_cpu(pid)[1]
    return total


async def start_child(side: str, opts: dict[str, Any]) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, SELF, "--child", side, json.dumps(opts)]
    proc = await asyncio.to_thread(subprocess.Popen, cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None

    def ready() -> bool:
        assert proc.stdout is not None
        return any(line.strip() == b"READY" for line in proc.stdout)  # FastStream logs to stdout: skip

    if not await asyncio.wait_for(asyncio.to_thread(ready), 60):
        raise RuntimeError(f"{side} relay did not start (exit {proc.wait()})")

    def forward() -> None:  # keep the pipe drained (a full pipe would block the child's logging)
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stderr.buffer.write(b"    [" + side.encode() + b"] " + line)
            sys.stderr.flush()

    threading.Thread(target=forward, daemon=True).start()
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
    rows = layout(args.count, args.streams, args.burst)
    target, sink = await declare_broker(args.broker, tag)
    rec = Received(want=args.count)
    close_consumer = await consume(args.broker, sink, rec)
    procs: list[subprocess.Popen[bytes]] = []
    outbox = None
    try:
        opts: dict[str, Any] = {"schema": schema, "table": table, "broker": args.broker, "target": target, "sink": sink}
        trickle: Callable[[], Awaitable[dict[tuple[int, int], float]]]
        if side == "outrelay":
            outbox = outrelay_prepare(schema)
            opts["batch_size"] = args.or_batch_size
            procs = [await start_child(side, opts) for _ in range(args.processes)]
            append: Callable[[list[tuple[int, int]]], Awaitable[None]] = lambda r: asyncio.to_thread(  # noqa: E731
                outrelay_append, outbox, r, args.size
            )
            trickle = lambda: asyncio.to_thread(outrelay_trickle, outbox, rows, args.size, args.rate)  # noqa: E731
        else:
            await fso_prepare(schema, table)
            if side == FSO_DEFAULTS:  # the library's own defaults (its docs' quick start)
                opts.update(workers=1, fetch=10, flush=1, min_fetch_interval=1.0, max_fetch_interval=10.0)
                opts["lease_ttl_seconds"] = 60.0
            else:
                opts.update(workers=args.fso_workers, fetch=args.fso_fetch, flush=args.fso_flush)
            procs = [await start_child("faststream-outbox", opts) for _ in range(args.processes)]
            append = lambda r: fso_append(schema, table, r, args.size)  # noqa: E731
            trickle = lambda: fso_trickle(schema, table, rows, args.size, args.rate)  # noqa: E731
        await append([(WARM_STREAM, 0)])
        await asyncio.wait_for(rec.warm.wait(), 30)
        pids = [p.pid for p in procs]
        commits: dict[tuple[int, int], float] = {}
        if args.rate:
            started = time.perf_counter()
            cpu0 = cpu_seconds(pids)
            commits = await trickle()
        else:
            await append(rows)
            started = time.perf_counter()
            cpu0 = cpu_seconds(pids)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(rec.done.wait(), args.timeout)
        ended = rec.done_at if rec.done.is_set() else time.perf_counter()
        cpu = cpu_seconds(pids) - cpu0
        await asyncio.sleep(0.3)  # late duplicates / stragglers still count in the order check
        latency = [(rec.arrived[k] - t) * 1000 for k, t in commits.items() if k in rec.arrived]
        return Result(side, ended - started, len(rec.seen), rec.duplicates, rec.out_of_order, cpu, latency)
    finally:
        for proc in procs:
            await stop_child(proc)
        await close_consumer()
        if outbox is not None:
            outbox.close()
        await delete_broker(args.broker, target, sink)
        drop_schema(schema)


async def main(args: argparse.Namespace) -> None:
    sides = [s for s in SIDES if s in args.sides.split(",")]
    if args.rate:
        args.count = int(args.rate * args.seconds)
    results: dict[str, list[Result]] = {s: [] for s in sides}
    for r in range(args.rounds):
        for side in sides if r % 2 == 0 else reversed(sides):
            res = await one_run(side, args)
            results[side].append(res)
            if args.rate:
                print(
                    f"  round {r + 1} {side:26s}: commit -> consumer p50 {res.pct(0.5):6.2f} ms, "
                    f"p99 {res.pct(0.99):6.2f} ms; {res.received}/{args.count} received; relay CPU "
                    f"{res.relay_cpu:.2f} s = {100 * res.relay_cpu / res.seconds:.0f} % of a core, "
                    f"{1e6 * res.relay_cpu / max(1, res.received):.0f} µs per event",
                    flush=True,
                )
                continue
            print(
                f"  round {r + 1} {side:18s}: {res.rate:8.0f} ev/s ({res.seconds:6.2f} s, "
                f"{res.received}/{args.count} received, {res.duplicates} dup, {res.out_of_order} out-of-order; "
                f"relay CPU {res.relay_cpu:.1f} s = {1e6 * res.relay_cpu / max(1, res.received):.0f} us/event)",
                flush=True,
            )
    where = f"RabbitMQ ({MQ_URL.split('@')[-1]})" if args.broker == "rabbitmq" else f"NATS JetStream ({NATS_URL})"
    if args.rate:
        trickle_summary(results, args, where)
        return
    med = {s: statistics.median(x.rate for x in results[s]) if s in sides else 0.0 for s in SIDES}
    print(
        f"PostgreSQL -> {where}, {args.count} events x {args.size} B, "
        f"{args.streams} streams (bursts of {args.burst}), one commit, {args.processes} relay process(es) per side; "
        f"consumer-side, median of {args.rounds}"
    )
    print(
        f"  outrelay          : {med['outrelay']:8.0f} ev/s  (batch_size={args.or_batch_size}, other options default)"
    )
    print(
        f"  faststream-outbox : {med['faststream-outbox']:8.0f} ev/s  (max_workers={args.fso_workers}, "
        f"fetch_batch_size={args.fso_fetch}, terminal_flush_batch_size={args.fso_flush}, asyncpg)"
    )
    for s in sides:
        ooo = [x.out_of_order for x in results[s]]
        dup = [x.duplicates for x in results[s]]
        lost = [args.count - x.received for x in results[s]]
        print(f"  {s:18s}: out-of-order pairs per run {ooo}, duplicates {dup}, missing {lost}")
    if len(sides) < 2:
        return
    ratio = med["outrelay"] / med["faststream-outbox"] if med["faststream-outbox"] else float("inf")
    print(f"  ratio outrelay / faststream-outbox: {ratio:.2f}x (target >= 2x with per-stream order)")


def trickle_summary(results: dict[str, list[Result]], args: argparse.Namespace, where: str) -> None:
    """Medians per side of p50, p99 and relay CPU, and outrelay against the peer's best configuration."""
    print(
        f"PostgreSQL -> {where}, {args.rate:g} appends/s for {args.seconds:g} s (one event per transaction), "
        f"{args.size} B; median of {args.rounds} run(s) per side"
    )
    med: dict[str, tuple[float, float, float]] = {}
    for side, runs in results.items():
        med[side] = tuple(statistics.median(f(x) for x in runs) for f in (_p50, _p99, _cpu_share))  # type: ignore[assignment]
        print(f"  {side:26s}: p50 {med[side][0]:6.2f} ms, p99 {med[side][1]:6.2f} ms, relay CPU {med[side][2]:.0f} %")
    peers = [v for k, v in med.items() if k != "outrelay"]
    if "outrelay" in med and peers:
        mine, best_p50, best_cpu = med["outrelay"], min(p[0] for p in peers), min(p[2] for p in peers)
        print(
            f"  outrelay / peer's best: p50 {mine[0] / best_p50:.2f}, relay CPU {mine[2] / best_cpu:.2f} "
            "(target: both <= 1)"
        )


def _p50(r: Result) -> float:
    return r.pct(0.5)


def _p99(r: Result) -> float:
    return r.pct(0.99)


def _cpu_share(r: Result) -> float:
    return 100 * r.relay_cpu / r.seconds if r.seconds else float("nan")


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--broker", choices=("nats", "rabbitmq"), default="nats")
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--burst", type=int, default=1, help="consecutive events of one stream in append order")
    ap.add_argument(
        "--sides", default="", help=f"comma-separated subset of {','.join(SIDES)} (default: all with --rate, else two)"
    )
    ap.add_argument("--rate", type=float, default=0.0, help="appends per second, one per transaction (latency mode)")
    ap.add_argument("--seconds", type=float, default=10.0, help="--rate: seconds of appends")
    ap.add_argument("--processes", type=int, default=1, help="relay processes per side (both scale out this way)")
    ap.add_argument("--rounds", type=int, default=3, help="runs per side, interleaved; medians printed")
    ap.add_argument("--timeout", type=float, default=90.0, help="seconds one run may take before it is cut")
    ap.add_argument("--or-batch-size", type=int, default=1000, help="outrelay destination batch_size")
    ap.add_argument("--fso-workers", type=int, default=8, help="faststream-outbox max_workers")
    ap.add_argument("--fso-fetch", type=int, default=100, help="faststream-outbox fetch_batch_size")
    ap.add_argument("--fso-flush", type=int, default=100, help="faststream-outbox terminal_flush_batch_size")
    args = ap.parse_args()
    args.sides = args.sides or (",".join(SIDES) if args.rate else "outrelay,faststream-outbox")
    return args


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--child":
        child_main(sys.argv[2], sys.argv[3])
        sys.exit(0)
    try:
        missing = importlib.util.find_spec("faststream_outbox") is None or importlib.util.find_spec("aio_pika") is None
    except ModuleNotFoundError:
        missing = True
    if missing:
        print(f"faststream-outbox is not installed; install it with: .venv/bin/pip install {INSTALL}")
        sys.exit(2)
    asyncio.run(main(parse_args()))
