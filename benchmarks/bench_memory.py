"""Relay peak RSS while it relays large events (the byte budgets at work).

    .venv/bin/python benchmarks/bench_memory.py [--count 2000] [--size 1048576] [--mixed 1000]
        [--routes] [--data bytes|str|json|all]

Appends ``--count`` events of ``--size`` bytes to a fresh SQLite outbox, then
runs ``outrelay run --drain`` in a subprocess to a webhook destination (binary
mode) served by a discarding HTTP server in this process, and prints the
relay's peak RSS (``VmHWM`` from /proc, sampled until it exits) and its run
time. ``--mixed N`` runs a second round with N events of random sizes from
1 KiB to 6 MiB. The relay's byte budgets come from the defaults unless
``--max-in-flight-bytes`` / ``--max-batch-bytes`` are given.

``--routes`` adds a ``[[routes]]`` table with type and tenant filters (content
routing: the router sees every event's envelope), and ``--data`` picks the
payload kind: ``bytes``, ``str`` (text) or ``json`` (a JSON object of about the
same size); ``all`` runs each in turn.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
from pathlib import Path

from _checkout import RELAY_ENV, ROOT

from outrelay import Event, Outbox


class Sink:
    """HTTP/1.1 server that reads each request body and answers 204 (keeps nothing)."""

    def __init__(self) -> None:
        self.requests = 0
        self.bytes = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                while length:
                    chunk = await reader.read(min(length, 1 << 16))
                    if not chunk:
                        return
                    length -= len(chunk)
                    self.bytes += len(chunk)
                self.requests += 1
                writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


def vm_hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def payload(kind: str, n: int) -> bytes | str | dict[str, str]:
    """About ``n`` bytes of data of ``kind``."""
    if kind == "str":
        return "x" * n
    if kind == "json":
        return {"blob": "x" * max(0, n - 12)}
    return b"x" * n


ROUTES = '[[routes]]\ntypes = ["bench.*"]\ntenants = ["acme"]\ndestinations = ["sink"]\n'


async def round_(label: str, sizes: list[int], args: argparse.Namespace, kind: str) -> None:
    sink = Sink()
    server = await asyncio.start_server(sink.handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/outbox.db"
        with Outbox.open(url, max_event_bytes=None) as outbox:
            for lo in range(0, len(sizes), 50):
                outbox.append(
                    [
                        Event(type="bench.mem", stream=f"s{i % 50}", tenant="acme", data=payload(kind, n))
                        for i, n in enumerate(sizes[lo : lo + 50], start=lo)
                    ]
                )
        relay_opts = "".join(
            f"{k} = {v}\n"
            for k, v in (("max_in_flight_bytes", args.max_in_flight_bytes), ("max_batch_bytes", args.max_batch_bytes))
            if v
        )
        cfg = Path(tmp, "outrelay.toml")
        cfg.write_text(  # noqa: ASYNC240 (setup, before anything runs)
            f'[outbox]\nurl = "{url}"\nmax_event_bytes = {10 * 1024 * 1024}\n[relay]\n{relay_opts}'
            f'[destinations.sink]\ntransport = "webhook"\nurl = "http://127.0.0.1:{port}/in"\n'
            f'allow_private_network = true\nmode = "binary"\nmax_message_bytes = {10 * 1024 * 1024}\n'
            + (ROUTES if args.routes else "")
        )
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "outrelay", "run", "--drain", "-c", str(cfg), "--log-level", "warning",
            cwd=ROOT, env=RELAY_ENV,
        )  # fmt: skip
        peak = 0.0
        while proc.returncode is None:
            peak = max(peak, vm_hwm_mb(proc.pid))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 0.1)
        elapsed = time.monotonic() - started
    server.close()
    total = sum(sizes) / 2**20
    print(
        f"{label}, {kind} data, {'routes' if args.routes else 'no routes'}: "
        f"{len(sizes)} events, {total:,.0f} MiB of data -> {sink.requests} requests in {elapsed:.1f}s; "
        f"relay peak RSS {peak:,.0f} MB (exit {proc.returncode})"
    )


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=2000)
    ap.add_argument("--size", type=int, default=1024 * 1024)
    ap.add_argument("--mixed", type=int, default=1000, help="events of random sizes in round 2 (0: skip)")
    ap.add_argument("--max-in-flight-bytes", type=int, default=0)
    ap.add_argument("--max-batch-bytes", type=int, default=0)
    ap.add_argument("--routes", action="store_true", help="a [[routes]] table with type and tenant filters")
    ap.add_argument("--data", choices=("bytes", "str", "json", "all"), default="bytes", help="payload kind")
    args = ap.parse_args()
    for kind in ("bytes", "str", "json") if args.data == "all" else (args.data,):
        await round_(f"{args.size:,} B each", [args.size] * args.count, args, kind)
        if args.mixed:
            rng = random.Random(7)
            sizes = [rng.randint(1024, 6 * 2**20) for _ in range(args.mixed)]
            await round_("mixed 1 KiB-6 MiB", sizes, args, kind)


if __name__ == "__main__":
    asyncio.run(main())
