"""Event bus benchmarks: consume throughput through the runtime, and commit → handler latency.

::

    python benchmarks/bench_bus.py throughput --backend redis [--count 20000]
    python benchmarks/bench_bus.py latency --backend nats [--rate 1000 --seconds 10]

``throughput``: N 1 KB events over 100 streams are published first (through
the transport), then one group member of an :class:`EventBus` handles them
with a handler that only counts; prints ev/s. (Each backend's
``bench_subscribe_<backend>.py`` times the raw client's own consumer loop
and the bare backend on the same machine; compare with those.)

``latency``: an appender process commits events one per transaction at
``--rate`` ev/s to a SQLite outbox; ``outrelay run`` relays them from its
own process to the broker; a group member in this process handles them. Each event
carries its commit time; the handler records ``now - commit``. Prints
p50/p90/p99/max in ms. Brokers on 127.0.0.1 (Redis, NATS, RabbitMQ; Kafka
needs ``--kafka host:port``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import orjson

from outrelay import Event, EventBus, Outbox, parse_config

ROOT = Path(__file__).resolve().parents[1]


def destination(backend: str, tag: str, kafka: str | None, shards: int | None = None) -> dict[str, Any]:
    extra: dict[str, Any] = {"group_shards": shards} if shards else {}
    if backend == "redis":
        return {"transport": "redis", "url": "redis://127.0.0.1:6379/0", "stream": f"outrelay:bench-bus:{tag}"}
    if backend == "nats":
        subject = f"bench.bus.{tag}"
        stream = {"name": f"BENCH_BUS_{tag}".upper(), "subjects": [f"{subject}.>"], "storage": "memory"}
        return {"transport": "nats", "servers": ["nats://127.0.0.1:4222"], "subject": subject + ".{type}",
                "create_stream": stream, **extra}  # fmt: skip
    if backend == "rabbitmq":
        return {"transport": "rabbitmq", "exchange": f"bench-bus-{tag}", "declare_exchange": True, **extra}
    if backend == "kafka":
        if not kafka:
            raise SystemExit("kafka needs --kafka HOST:PORT (e.g. a tansu broker; see tests/peers/kafka.py)")
        return {"transport": "kafka", "bootstrap_servers": kafka, "topic": f"bench-bus-{tag}",
                "enable_idempotence": False}  # fmt: skip
    if backend == "memory":
        return {"transport": "memory", "broker": f"bench-{tag}"}
    raise SystemExit(f"unknown backend {backend!r}")


def _toml(dest: dict[str, Any], outbox: str) -> str:
    flat = {k: v for k, v in dest.items() if not isinstance(v, dict)}
    lines = ["[outbox]", f'url = "{outbox}"', "[relay]", "poll_interval = 0.5", "[destinations.bus]"]
    lines += [f"{k} = {orjson.dumps(v).decode()}" for k, v in flat.items()]
    for k, v in dest.items():
        if isinstance(v, dict):
            lines += [f"[destinations.bus.{k}]", *(f"{kk} = {orjson.dumps(vv).decode()}" for kk, vv in v.items())]
    return "\n".join(lines) + "\n"


async def throughput(args: argparse.Namespace) -> None:
    dest = destination(args.backend, uuid.uuid4().hex[:8], args.kafka, args.shards)
    cfg = parse_config({"destinations": {"bus": dest}})
    payload = {"pad": "x" * 1000}
    events = [Event(type="order.created", stream=f"s{i % 100}", data=payload) for i in range(args.count)]
    async with EventBus.from_config(cfg, destination="bus") as bus:
        done = asyncio.Event()
        seen = 0

        async def handler(_: Event) -> None:
            nonlocal seen
            seen += 1
            if seen >= args.count:
                done.set()

        await bus.subscribe(handler, group="bench", prefetch=args.prefetch, concurrency=100)
        for i in range(0, len(events), 1000):
            await bus.publish(events[i : i + 1000])
        t0 = time.perf_counter()  # the events are stored; time only the consuming side from here
        await asyncio.wait_for(done.wait(), 300)
        elapsed = time.perf_counter() - t0
    print(f"{args.backend}: EventBus group member handled {args.count} events in {elapsed:.2f} s = "
          f"{args.count / elapsed:,.0f} ev/s (handler only counts; events were published before timing)")  # fmt: skip


_APPENDER = """
import sys, time
from outrelay import Event, Outbox
url, rate, total = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
outbox = Outbox.open(url)
t0 = time.perf_counter()
for n in range(total):
    delay = t0 + n / rate - time.perf_counter()
    if delay > 0:
        time.sleep(delay)
    # the commit time (a moment before the commit) travels in the data; one transaction per event
    outbox.append(Event(type="order.created", stream=f"s{n % 100}", data={"t": time.time()}))
outbox.close()
"""


async def latency(args: argparse.Namespace) -> None:
    tag = uuid.uuid4().hex[:8]
    dest = destination(args.backend, tag, args.kafka, args.shards)
    lat: list[float] = []
    total = int(args.rate * args.seconds)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with tempfile.TemporaryDirectory() as tmp:
        outbox_url = f"sqlite:///{tmp}/outbox.db"
        cfg_path = Path(tmp) / "outrelay.toml"
        cfg_path.write_text(_toml(dest, outbox_url))
        Outbox.open(outbox_url).close()  # create the schema before the relay and the appender start
        relay = subprocess.Popen(  # noqa: ASYNC220 - started once, before timing
            [sys.executable, "-m", "outrelay", "run", "-c", str(cfg_path)], cwd=ROOT, env=env
        )
        try:
            async with EventBus.from_config(cfg_path, destination="bus", dead_letters="memory") as bus:

                async def handler(e: Event) -> None:
                    lat.append(time.time() - orjson.loads(e.data)["t"])

                await bus.subscribe(handler, group="latency")
                await asyncio.sleep(2.0)  # the relay process starts
                appender = await asyncio.create_subprocess_exec(
                    sys.executable, "-c", _APPENDER, outbox_url, str(args.rate), str(total), cwd=ROOT, env=env
                )
                await appender.wait()
                deadline = time.monotonic() + 30
                while len(lat) < total and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
        finally:
            relay.terminate()
            relay.wait(30)
    ms = sorted(x * 1000 for x in lat)
    if not ms:
        raise SystemExit("no event reached the handler")

    def pct(p: float) -> float:
        return ms[min(len(ms) - 1, int(p * len(ms)))]

    print(
        f"{args.backend}: {len(ms)}/{total} events at {args.rate:g} ev/s, commit -> handler (appender, relay and "
        f"subscriber in three processes): p50 {pct(0.5):.1f} ms, p90 {pct(0.9):.1f} ms, p99 {pct(0.99):.1f} ms, "
        f"max {ms[-1]:.1f} ms, mean {statistics.fmean(ms):.1f} ms"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["throughput", "latency"])
    p.add_argument("--backend", default="redis", choices=["memory", "redis", "nats", "kafka", "rabbitmq"])
    p.add_argument("--count", type=int, default=20_000)
    p.add_argument("--prefetch", type=int, default=1000)
    p.add_argument("--rate", type=float, default=1000.0)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--shards", type=int, default=None, help="group_shards (NATS, RabbitMQ); default: the transport's")
    p.add_argument("--kafka", default=None, help="bootstrap servers of a Kafka-API broker")
    args = p.parse_args()
    asyncio.run(throughput(args) if args.what == "throughput" else latency(args))


if __name__ == "__main__":
    main()
