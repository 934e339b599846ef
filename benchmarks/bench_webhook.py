"""Relay SQLite -> signed webhooks vs a raw aiohttp client, against the same WebhookReceiver.

    .venv/bin/python benchmarks/bench_webhook.py [--count 100000] [--streams 100] [--size 1024]
    .venv/bin/python benchmarks/bench_webhook.py --count 20000          # < 1 minute

The receiver runs in a separate process by default (``--in-process`` puts it
in the relay's event loop) and verifies every Standard Webhooks signature.
Prints events/s for:

* raw aiohttp: ``aiohttp.ClientSession.post`` of the same signed structured
  CloudEvents requests (pre-encoded and pre-signed, 1 KB data), with
  ``--concurrency`` requests in flight on a keep-alive pool of as many
  connections; timed before and after the relay (see ``_ratio.py``);
* transport: the webhook transport's ``send()`` alone (no outbox), batches of
  ``--batch-size`` events over the same streams;
* relay: ``outrelay.Relay(drain=True)`` from a SQLite outbox holding the
  events (append time excluded) through the webhook transport, whose
  ``concurrency`` is the same ``--concurrency``;

then relay / raw (target >= 0.8) and how many requests the receiver verified
and accepted. The CPU time per event of the relay process and of the raw
client are printed too: on a shared machine they are steadier than events/s.
Every event is one HTTP request. Needs ``aiohttp`` (in the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from typing import Any

from _ratio import ratio, raw_line

from outrelay import Event, Message, Outbox, Relay, parse_config
from outrelay.core.model import cloudevents
from outrelay.transports.webhook._signing import normalize_secrets, signature_headers
from outrelay.transports.webhook._transport import WebhookConfig, WebhookTransport
from outrelay.transports.webhook.receiver import WebhookReceiver

SECRET = "whsec_YmVuY2htYXJrLXNlY3JldC1iZW5jaG1hcmstc2VjcmV0"


def make_events(count: int, streams: int, size: int, tag: str) -> list[Event]:
    payload = b"x" * size
    return [Event(type=f"bench.webhook.{tag}", stream=f"s{i % streams}", data=payload) for i in range(count)]


async def serve_forever() -> None:
    """Child process: run a receiver, print its URL, stop when stdin closes, print counts."""
    async with WebhookReceiver(secrets=SECRET) as rx:
        print(rx.url, flush=True)
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.read)
        accepted = len(rx.accepted())
        print(f"{len(rx.requests)} {sum(r.verified for r in rx.requests)} {accepted}", flush=True)


async def raw_aiohttp(url: str, events: list[Event], concurrency: int) -> tuple[float, float]:
    """Post pre-signed structured requests with ``concurrency`` workers; (seconds, CPU seconds)."""
    try:
        import aiohttp
    except ImportError:
        sys.exit('bench_webhook.py needs aiohttp for the raw client: pip install -e ".[dev]" (or aiohttp)')

    keys = normalize_secrets(SECRET)
    requests = []
    for e in events:
        body = cloudevents.to_structured(e)
        headers = {"content-type": cloudevents.STRUCTURED_CONTENT_TYPE, **signature_headers(keys, e.id, body)}
        requests.append((headers, body))
    todo = iter(requests)
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=15)) as session:

        async def worker() -> None:
            for headers, body in todo:
                async with session.post(url, data=body, headers=headers) as response:
                    await response.read()
                    assert 200 <= response.status < 300, response.status

        started, cpu = time.perf_counter(), time.process_time()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started, time.process_time() - cpu


async def raw(url: str, options: dict[str, Any], events: list[Event], batch_size: int) -> float:
    t = WebhookTransport(WebhookConfig(url=url, **options))
    await t.open()
    try:
        started = time.perf_counter()
        for lo in range(0, len(events), batch_size):
            batch = [Message(e, url, e.stream) for e in events[lo : lo + batch_size]]
            results = await t.send(batch)
            assert all(type(r).__name__ == "Delivered" for r in results), results[:3]
        return time.perf_counter() - started
    finally:
        await t.close()


async def relay(
    url: str, options: dict[str, Any], events: list[Event], args: argparse.Namespace
) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        db = f"sqlite:///{tmp}/o.db"
        outbox = Outbox.open(db)
        for lo in range(0, len(events), 10_000):
            outbox.append(events[lo : lo + 10_000])
        dest = {
            "transport": "webhook",
            "url": url,
            **options,
            "batch_size": args.batch_size,
            "max_in_flight": args.in_flight,
            "per_stream": args.per_stream,
        }
        cfg = parse_config({"outbox": {"url": db}, "destinations": {"d": dest}})
        started, cpu = time.perf_counter(), time.process_time()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        outbox.close()
    delivered = summary.counts["d"]["delivered"]
    assert delivered == len(events), f"relay delivered {delivered} of {len(events)}: {summary.status}"
    return elapsed, cpu


async def bench(url: str, args: argparse.Namespace) -> None:
    options = {"secret": SECRET, "allow_private_network": True, "concurrency": args.concurrency}
    n_raw = max(1, args.count // 10)
    secs = await raw(url, options, make_events(n_raw, args.streams, args.size, "transport"), args.batch_size)
    print(f"transport send():      {n_raw / secs:9,.0f} events/s  ({n_raw:,} events in {secs:.1f}s)")
    n = args.count
    before, cpu_before = await raw_aiohttp(url, make_events(n, args.streams, args.size, "aiohttp1"), args.concurrency)
    relay_secs, cpu = await relay(url, options, make_events(n, args.streams, args.size, "relay"), args)
    after, cpu_after = await raw_aiohttp(url, make_events(n, args.streams, args.size, "aiohttp2"), args.concurrency)
    raw_cpu = 1e6 * (cpu_before + cpu_after) / (2 * n)
    print(f"raw aiohttp:           {raw_line(n, before, after)}, client CPU {raw_cpu:.1f} µs per event")
    print(
        f"relay SQLite->webhook: {n / relay_secs:10.0f} ev/s ({n:,} events in {relay_secs:.1f}s), "
        f"relay process CPU {1e6 * cpu / n:.1f} µs per event"
    )
    print(f"relay / raw aiohttp:   {ratio(n, relay_secs, before, after):.2f}  (target >= 0.8)")


async def main(args: argparse.Namespace) -> None:
    print(
        f"{args.count:,} events of {args.size} B over {args.streams} streams; concurrency {args.concurrency}, "
        f"batch {args.batch_size}, in flight {args.in_flight}, receiver "
        + ("in-process" if args.in_process else "in a child process")
    )
    if args.in_process:
        async with WebhookReceiver(secrets=SECRET) as rx:
            await bench(rx.url + "/hook", args)
            print(f"receiver: {len(rx.requests):,} requests, {len(rx.accepted()):,} verified and accepted")
        return
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--serve", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    try:
        url = (await child.stdout.readline()).decode().strip()
        await bench(url + "/hook", args)
    finally:
        child.stdin.close()
        stats = (await child.stdout.readline()).decode().split()
        await asyncio.wait_for(child.wait(), 30)
    if len(stats) == 3:
        total, verified, accepted = map(int, stats)
        print(f"receiver: {total:,} requests, {verified:,} verified, {accepted:,} accepted")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=100)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--per-stream", type=int, default=16)
    ap.add_argument("--concurrency", type=int, default=16, help="requests in flight per batch")
    ap.add_argument("--in-process", action="store_true", help="run the receiver in the relay's event loop")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parsed = ap.parse_args()
    asyncio.run(serve_forever() if parsed.serve else main(parsed))
