"""Cost of building one Event on the hot paths: a Kafka record decoded, Event.checked, a store row, with_sequence.

    .venv/bin/python benchmarks/bench_decode.py [--calls 20000] [--instructions]

Prints, per step, the best of 7 timings in µs per call. On a shared machine those
move by 20-30 % from run to run; ``--instructions`` instead runs each step under
valgrind's callgrind (``apt-get install valgrind``) twice, with 0 and ``--calls``
calls, and prints the difference per call: CPU instructions, the same on every
run of the same code, so an A/B of two commits can be read from one run each.

The steps (one 1 KB event with outrelay's usual attributes):

* ``kafka-decode``: ``transports.kafka._wire.decode`` of the record the kafka
  transport writes for it (headers decoded, the event validated);
* ``checked``: ``Event.checked`` on its fields (what every decoder ends in);
* ``store-row``: ``Event.from_attributes`` on its stored attributes (every claim);
* ``with-sequence``: ``Event.with_sequence`` (every SQLite append).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import timeit
from collections.abc import Callable

from outrelay import Event
from outrelay.transports.kafka._wire import decode, encode


def steps() -> dict[str, Callable[[], object]]:
    event = Event(type="bench.decode", stream="order-42", data=b"x" * 1024, tenant="acme").with_sequence(7)
    value, headers = encode(event, "binary")
    record_headers = tuple(headers)
    fields = {
        "id": event.id, "source": event.source, "type": event.type, "time": event.time_text, "stream": event.stream,
        "event_version": event.event_version, "content_type": event.content_type, "tenant": event.tenant,
        "sequence": event.sequence,
    }  # fmt: skip
    attrs = event.attributes()
    return {
        "kafka-decode": lambda: decode("topic", b"order-42", value, record_headers),
        "checked": lambda: Event.checked(fields, value),
        "store-row": lambda: Event.from_attributes(attrs, value, 7),
        "with-sequence": lambda: event.with_sequence(8),
    }


def run_calls(step: str, calls: int) -> None:
    call = steps()[step]
    call()  # warm: caches, first-use imports
    for _ in range(calls):
        call()


def instructions(step: str, calls: int) -> int:
    def collected(n: int) -> int:
        out = subprocess.run(
            ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__,
             "--run", step, "--calls", str(n)],
            capture_output=True, text=True, check=True,
        ).stderr  # fmt: skip
        found = re.search(r"Collected : (\d+)", out)
        if found is None:
            raise SystemExit(f"callgrind printed no instruction count for {step}:\n{out[-500:]}")
        return int(found.group(1))

    return (collected(calls) - collected(0)) // calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--calls", type=int, default=20_000)
    ap.add_argument("--instructions", action="store_true", help="count CPU instructions under callgrind")
    ap.add_argument("--run", help=argparse.SUPPRESS)  # one step, for callgrind
    args = ap.parse_args()
    if args.run:
        run_calls(args.run, args.calls)
        return
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (apt-get install valgrind)")
    for step, call in steps().items():
        if args.instructions:
            print(f"{step:14s} {instructions(step, args.calls):8,d} instructions per call")
        else:
            number = args.calls // 7 or 1
            best = min(timeit.repeat(call, number=number, repeat=7)) / number
            print(f"{step:14s} {best * 1e6:8.2f} µs per call")


if __name__ == "__main__":
    main()
