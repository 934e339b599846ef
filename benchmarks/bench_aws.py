"""Relay throughput SQLite → SQS/SNS beside raw boto3 on the same endpoint, in one run.

    .venv/bin/python benchmarks/bench_aws.py [--events 2000] [--streams 50] [--workers 4]

Starts moto in server mode (the tests' launcher, ``python -m tests.peers.moto``)
on a free port unless ``OUTRELAY_AWS_ENDPOINT_URL`` is set. For each of SQS
standard, SQS FIFO, SNS standard and SNS FIFO it measures:

* raw: boto3 ``send_message_batch``/``publish_batch`` of 10 entries per call
  from ``--workers`` threads (the same concurrency the transport uses), with
  the same structured-CloudEvent bodies, pre-encoded;
* relay: ``Relay(outbox).run(drain=True)`` over the same number of events
  already appended to a SQLite outbox (appending is not timed);

and prints both rates and relay/raw. Figures against moto measure moto (a
single Python process) as much as outrelay; the ratio is what to look at.
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
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from outrelay import Event, Outbox, Relay, parse_config  # noqa: E402
from outrelay.transports.aws._wire import fifo_id, message_attributes, structured_body  # noqa: E402
from tests.peers.moto import aws_client, aws_options  # noqa: E402
from tests.services import free_port, wait_port  # noqa: E402


def events(n: int, streams: int) -> list[Event]:
    return [Event(type="bench.event", stream=f"s{i % streams}", data={"i": i, "pad": "x" * 100}) for i in range(n)]


def raw_entries(evs: list[Event], fifo: bool, body_key: str) -> list[dict[str, Any]]:
    out = []
    for e in evs:
        entry: dict[str, Any] = {body_key: structured_body(e), "MessageAttributes": message_attributes(e)}
        if fifo:
            entry["MessageGroupId"] = fifo_id(e.stream)
            entry["MessageDeduplicationId"] = fifo_id(e.id)
        out.append(entry)
    return out


def raw_rate(service: str, endpoint: str, target: str, evs: list[Event], fifo: bool, workers: int) -> float:
    client = aws_client(service, endpoint)
    entries = raw_entries(evs, fifo, "MessageBody" if service == "sqs" else "Message")
    chunks = [[{**e, "Id": str(i)} for i, e in enumerate(entries[j : j + 10])] for j in range(0, len(entries), 10)]

    def send(chunk: list[dict[str, Any]]) -> None:
        if service == "sqs":
            r = client.send_message_batch(QueueUrl=target, Entries=chunk)
        else:
            r = client.publish_batch(TopicArn=target, PublishBatchRequestEntries=chunk)
        assert not r.get("Failed"), r["Failed"]

    started = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        list(pool.map(send, chunks))
    return len(evs) / (time.perf_counter() - started)


async def relay_rate(endpoint: str, dest: dict[str, Any], evs: list[Event]) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        outbox = Outbox.open(f"sqlite:///{tmp}/o.db")
        outbox.append(evs)
        cfg = parse_config({"outbox": {"url": outbox.url}, "destinations": {"d": dest}})
        started = time.perf_counter()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.perf_counter() - started
        assert summary.remaining == 0 and summary.dead_lettered == 0, summary
        close = getattr(outbox.store, "close", None)
        if close:
            close()
    return len(evs) / elapsed


def make_target(service: str, endpoint: str, fifo: bool) -> str:
    name = f"bench-{uuid.uuid4().hex[:8]}" + (".fifo" if fifo else "")
    if service == "sqs":
        attrs = {"FifoQueue": "true"} if fifo else {}
        return str(aws_client("sqs", endpoint).create_queue(QueueName=name, Attributes=attrs)["QueueUrl"])
    attrs = {"FifoTopic": "true"} if fifo else {}
    return str(aws_client("sns", endpoint).create_topic(Name=name, Attributes=attrs)["TopicArn"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--events", type=int, default=2000)
    ap.add_argument("--streams", type=int, default=50)
    ap.add_argument("--workers", type=int, default=4, help="boto3 threads, raw and transport alike")
    args = ap.parse_args()
    endpoint = os.environ.get("OUTRELAY_AWS_ENDPOINT_URL")
    proc = None
    if not endpoint:
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.peers.moto", "-H", "127.0.0.1", "-p", str(port)],
            cwd=ROOT,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_port("127.0.0.1", port, 30):
            sys.exit("moto did not start")
        endpoint = f"http://127.0.0.1:{port}"
    try:
        print(f"endpoint {endpoint}; {args.events} events over {args.streams} streams; {args.workers} threads")
        print(f"{'target':<14} {'raw boto3 msg/s':>16} {'relay msg/s':>12} {'relay/raw':>10}")
        for service in ("sqs", "sns"):
            key = "queue_url" if service == "sqs" else "topic_arn"
            for fifo in (False, True):
                raw = raw_rate(
                    service,
                    endpoint,
                    make_target(service, endpoint, fifo),
                    events(args.events, args.streams),
                    fifo,
                    args.workers,
                )
                dest = {
                    "transport": service,
                    key: make_target(service, endpoint, fifo),
                    **aws_options(endpoint),
                    "max_workers": args.workers,
                    "batch_size": 100,
                    "max_in_flight": 8,
                }
                rel = asyncio.run(relay_rate(endpoint, dest, events(args.events, args.streams)))
                label = f"{service} {'FIFO' if fifo else 'standard'}"
                print(f"{label:<14} {raw:>16.0f} {rel:>12.0f} {rel / raw:>10.2f}")
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
