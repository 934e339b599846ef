"""Relay throughput SQLite -> Service Bus next to the raw azure-servicebus SDK, same peer, same run.

    .venv/bin/python benchmarks/bench_servicebus.py [--count 20000] [--streams 50] [--size 1024]

The peer is the project's AMQP 1.0 wire-protocol test peer (not Azure Service
Bus), started here in a child process, unless ``OUTRELAY_SERVICEBUS_CONNECTION_STRING`` and
``OUTRELAY_SERVICEBUS_SESSION_QUEUE`` name a real namespace. Both runs use a
session queue (SessionId = stream). Prints events/s for:

* raw:   one async ``ServiceBusSender``, messages with the same body,
         ``cloudEvents_*`` properties, MessageId and SessionId (built before
         the clock starts), sent in ``ServiceBusMessageBatch``es one after another;
* relay: ``outrelay.Relay(drain=True)`` from a SQLite outbox holding the
         events (append time excluded) through the servicebus transport.

Most of either figure is the SDK's pure-Python AMQP encoding; the peer is
Python too, so these are not Service Bus figures.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from outrelay import Event, Outbox, Relay, parse_config  # noqa: E402
from outrelay.core.model import cloudevents  # noqa: E402


async def raw(conn: str, queue: str, events: list[Event], encode_inside: bool = False) -> float:
    from azure.servicebus import ServiceBusMessage
    from azure.servicebus.aio import ServiceBusClient

    def build() -> list[ServiceBusMessage]:
        return [
            ServiceBusMessage(
                e.data,
                message_id=e.id,
                session_id=e.stream,
                content_type=e.content_type,
                application_properties=cloudevents.binary_headers(e, prefix="cloudEvents_"),  # type: ignore[arg-type]
            )
            for e in events
        ]

    msgs = [] if encode_inside else build()
    client = ServiceBusClient.from_connection_string(conn, retry_total=0)
    async with client, client.get_queue_sender(queue) as sender:
        started = time.perf_counter()
        if encode_inside:
            msgs = build()
        batch = await sender.create_message_batch()
        for m in msgs:
            try:
                batch.add_message(m)
            except ValueError:  # MessageSizeExceededError: the batch is full
                await sender.send_messages(batch)
                batch = await sender.create_message_batch()
                batch.add_message(m)
        await sender.send_messages(batch)
        return time.perf_counter() - started


async def relay(conn: str, queue: str, events: list[Event], batch_size: int, per_stream: int, in_flight: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/o.db"
        outbox = Outbox.open(url)
        outbox.append(events)
        dest = {"transport": "servicebus", "connection_string": conn, "queue": queue, "sessions": True}
        cfg = parse_config(
            {
                "outbox": {"url": url},
                "destinations": {
                    "d": {**dest, "batch_size": batch_size, "per_stream": per_stream, "max_in_flight": in_flight}
                },
            }
        )
        started = time.perf_counter()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.perf_counter() - started
        outbox.close()
    assert summary.counts["d"]["delivered"] == len(events), summary.counts
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=1000)
    ap.add_argument("--per-stream", type=int, default=100)
    ap.add_argument("--in-flight", type=int, default=4)
    ap.add_argument("--encode-in-raw", action="store_true", help="time the raw client's message building too")
    args = ap.parse_args()
    peer = None
    conn = os.environ.get("OUTRELAY_SERVICEBUS_CONNECTION_STRING")
    if conn:
        raw_q = relay_q = os.environ["OUTRELAY_SERVICEBUS_SESSION_QUEUE"]
        where = "namespace from OUTRELAY_SERVICEBUS_CONNECTION_STRING"
    else:
        # the peer runs in its own process so that it does not share the GIL with the client
        from tests.peers.amqp_servicebus_peer import connection_string
        from tests.services import free_port

        port = free_port()
        raw_q, relay_q = f"raw-{uuid.uuid4().hex[:6]}", f"relay-{uuid.uuid4().hex[:6]}"
        peer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.peers.amqp_servicebus_peer",
                str(port),
                f"{raw_q}:sessions",
                f"{relay_q}:sessions",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=ROOT,
        )
        assert peer.stdout is not None and peer.stdout.readline().strip() == b"ready", "peer did not start"
        conn = connection_string(port)
        where = "AMQP 1.0 wire-protocol test peer in its own process, not Azure Service Bus"
    try:
        payload = b"x" * args.size
        events = [Event(type="bench.sb", stream=f"s{i % args.streams}", data=payload) for i in range(args.count)]
        t_raw = asyncio.run(raw(conn, raw_q, events, args.encode_in_raw))
        t_relay = asyncio.run(relay(conn, relay_q, events, args.batch_size, args.per_stream, args.in_flight))
        n = len(events)
        print(f"servicebus ({where}): {n} events, {args.streams} sessions, {args.size} B payloads")
        print(f"raw azure-servicebus (batches):   {n / t_raw:10.0f} events/s  ({t_raw:.2f} s)")
        print(f"outrelay relay SQLite -> sb:      {n / t_relay:10.0f} events/s  ({t_relay:.2f} s)")
        print(f"relay / raw:                      {t_raw / t_relay:10.2f}")
    finally:
        if peer is not None:
            assert peer.stdin is not None
            peer.stdin.close()  # the peer stops when its stdin closes
            peer.wait(10)


if __name__ == "__main__":
    main()
