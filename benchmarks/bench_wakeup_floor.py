"""What one wake-up of an idle asyncio event loop costs on this machine, at a trickle and faster.

    .venv/bin/python benchmarks/bench_wakeup_floor.py [--rates 100,300,1000] [--seconds 10]

A child process writes one byte to a pipe ``rate`` times a second; this process's
event loop, otherwise idle, reads each (one ``add_reader`` callback per byte).
Prints the loop process's CPU per wake-up and its share of one core. No relay
is involved: this is the floor under every wake-up a relay takes per event (the
append's notice, a timer, the broker's reply), which sleeping between events
makes expensive (caches gone cold; on a VM, the virtual CPU halted and resumed).
Compare it with ``bench_latency.py``'s CPU per event at the same rate.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time

WRITER = """
import os, sys, time
fd, rate, seconds = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
start = time.monotonic()
for i in range(int(rate * seconds)):
    wait = start + i / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    os.write(fd, b"x")
"""


async def measure(r: int) -> tuple[int, float]:
    """(wake-ups, CPU seconds of this process) until the writer of pipe end ``r`` exits."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    woken = 0

    def readable() -> None:
        nonlocal woken
        data = os.read(r, 4096)
        if not data:  # the writer exited
            loop.remove_reader(r)
            done.set_result(None)
            return
        woken += 1

    loop.add_reader(r, readable)
    before = time.process_time()
    await done
    return woken, time.process_time() - before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100,300,1000", help="wake-ups per second, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0)
    args = ap.parse_args()
    for rate in (float(x) for x in args.rates.split(",")):
        r, w = os.pipe()
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(w), str(rate), str(args.seconds)], pass_fds=(w,))
        os.close(w)
        try:
            woken, cpu = asyncio.run(measure(r))
        finally:
            os.close(r)
            child.wait()
        print(
            f"{rate:7.0f} wake-ups/s asked: {woken} wake-ups, {cpu / max(woken, 1) * 1e6:6.1f} µs of CPU each, "
            f"{100 * cpu / args.seconds:4.1f} % of a core"
        )


if __name__ == "__main__":
    main()
