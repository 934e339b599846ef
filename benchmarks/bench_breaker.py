"""The circuit breaker at full scale: a webhook receiver down for a minute while events keep coming.

    .venv/bin/python benchmarks/bench_breaker.py [--down 60] [--rate 10] [--failures 5] [--interval 5]

A ``Relay`` (in this process, SQLite outbox in a temporary directory) sends to a
``WebhookReceiver`` over loopback with ``[destinations.hooks.breaker] failures =
--failures, probe_interval = --interval``. Events are appended at ``--rate`` per
second over three streams for ``--down`` seconds while the receiver answers 503,
then it answers 204. The relay keeps going until every event is accepted.

Prints what the receiver counted: the failed requests before the breaker opened
(expected: ``--failures``), the requests while it was open and the receiver
down (expected: one per interval, ``--down`` / ``--interval`` give or take one),
the gap between each pair of them, the time from the receiver's return to the
breaker closing (expected: at most one interval), the events accepted per
stream in order, dead letters (expected: 0), and the CPU of the process. Exits 1 if
any of these is outside what the breaker promises. The tests run the same
scenario for 2 s (``tests/core/test_breaker.py``); this is the minute the
issue names.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import resource
import sys
import tempfile
import time
from pathlib import Path

from outrelay import Event, Outbox, Relay, hookimpl, parse_config
from outrelay.transports.webhook.receiver import WebhookReceiver

SECRET = "whsec_" + "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class Transitions:
    """Records the breaker's transitions with their times."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []

    @hookimpl
    def outrelay_breaker_changed(self, destination: str, state: str, reason: str) -> None:
        self.seen.append((time.time(), state))
        print(f"  {time.strftime('%H:%M:%S')} breaker {state}: {reason}", flush=True)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


async def run(args: argparse.Namespace, directory: Path) -> bool:
    async with WebhookReceiver(secrets=SECRET) as receiver:
        cfg = parse_config(
            {
                "outbox": {"url": f"sqlite:///{directory / 'outbox.db'}"},
                "destinations": {
                    "hooks": {
                        "transport": "webhook",
                        "url": receiver.url,
                        "secret": SECRET,
                        "allow_private_network": True,
                        "batch_size": 1,  # one request per attempt: the receiver counts attempts
                        "max_in_flight": 1,
                        "retry": {"initial_delay": 0.2, "max_delay": 2.0, "max_attempts": 1000},
                        "breaker": {"failures": args.failures, "probe_interval": args.interval},
                    }
                },
            }
        )
        down = True
        receiver.respond = lambda req: 503 if down else 204
        outbox = Outbox.open(cfg.outbox.url)
        relay = Relay(outbox, cfg)
        transitions = Transitions()
        relay.registry.pm.register(transitions)
        sent: list[Event] = []
        total = int(args.down * args.rate)
        start_cpu, start = cpu(), time.time()
        running = asyncio.create_task(relay.run())
        for i in range(total):
            e = Event(type="bench.breaker", stream=f"s{i % 3}", data={"i": i})
            outbox.append([e])
            sent.append(e)
            await asyncio.sleep(max(0.0, start + (i + 1) / args.rate - time.time()))
        up_at = time.time()
        down = False
        print(f"  {time.strftime('%H:%M:%S')} receiver up after {up_at - start:.1f} s, {total} events appended")
        done = await receiver.wait_until(lambda: len(receiver.accepted()) >= total, timeout=args.interval * 3 + 30)
        relay.stop()
        summary = await running
        used = cpu() - start_cpu
        outbox.close()

    opened = [t for t, s in transitions.seen if s == "open"]
    closed = [t for t, s in transitions.seen if s == "closed"]
    if len(opened) != 1 or len(closed) != 1 or not done:
        print(f"FAIL: transitions {[s for _, s in transitions.seen]}, all accepted: {done}")
        return False
    failed = [r for r in receiver.requests if r.status == 503]
    before = [r for r in failed if r.received_at <= opened[0]]
    probes = [r.received_at for r in receiver.requests if opened[0] < r.received_at <= closed[0]]
    down_probes = [t for t in probes if t <= up_at]
    expected = (up_at - opened[0]) / args.interval
    gaps = [b - a for a, b in itertools.pairwise(down_probes)]
    got: dict[str, list[int]] = {}
    for e in receiver.events():
        got.setdefault(e.stream, []).append(e.json()["i"])
    in_order = all(v == sorted(v) for v in got.values())
    close_gap = closed[0] - up_at
    print(f"failed requests before the breaker opened: {len(before)} (configured: {args.failures})")
    print(f"requests while open and the receiver down: {len(down_probes)} (expected {expected:.1f} +- 1)")
    if gaps:
        print(f"gap between those requests: min {min(gaps):.2f} s, max {max(gaps):.2f} s (interval {args.interval} s)")
    print(f"receiver up -> breaker closed: {close_gap:.2f} s (at most one interval, {args.interval} s)")
    print(
        f"events accepted: {sum(map(len, got.values()))} of {total}, per stream in order: {in_order}; "
        f"dead-lettered {summary.dead_lettered}, remaining {summary.remaining}"
    )
    print(f"CPU of this process (relay, appender and receiver): {used:.2f} s over {time.time() - start:.1f} s")
    ok = (
        len(before) == args.failures
        and expected - 1 <= len(down_probes) <= expected + 1
        and all(g >= args.interval * 0.9 for g in gaps)
        and close_gap <= args.interval + 0.5
        and in_order
        and sum(map(len, got.values())) == total
        and summary.dead_lettered == 0
    )
    print("OK" if ok else "FAIL")
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--down", type=float, default=60.0, help="seconds the receiver answers 503")
    parser.add_argument("--rate", type=float, default=10.0, help="events appended per second meanwhile")
    parser.add_argument("--failures", type=int, default=5, help="failed attempts in a row that open the breaker")
    parser.add_argument("--interval", type=float, default=5.0, help="probe_interval, seconds")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ok = asyncio.run(run(args, Path(tmp)))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
