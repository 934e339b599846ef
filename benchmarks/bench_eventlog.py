"""Relay throughput SQLite -> memory with event logs off and on, in one run.

    .venv/bin/python benchmarks/bench_eventlog.py [--count 50000] [--streams 100] [--size 256] [--rounds 3]

One outbox is filled once; every measurement relays a fresh copy of it to a
memory destination (``relay.run(drain=True)``). Modes, interleaved round by
round so machine drift hits them alike:

* ``off``       ``outrelay.events`` at WARNING (the library default): the plugin returns at once
* ``json``      one JSON line per event (the ``--log-format json`` formatter) to a file
* ``text``      one text line per event (the ``outrelay run`` text formatter) to a file
* ``json 10%``  ``[event_log] sample = 0.1``, JSON to a file

Prints each mode's best events/s over the rounds and its cost against ``off``
(the issue's target: logs cost at most 10%), and checks the line count.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.cli._jsonlog import JsonFormatter
from outrelay.plugins.eventlog import LOGGER_NAME
from outrelay.transports.memory import MemoryTransport

MODES = ("off", "json", "text", "json 10%")


def fill(path: Path, count: int, streams: int, size: int) -> None:
    pad = "x" * max(0, size - 40)
    with Outbox.open(f"sqlite:///{path}") as outbox:
        for start in range(0, count, 1000):
            outbox.append(
                [
                    Event(type="workflow.step", stream=f"s{i % streams}", tenant="acme", data={"i": i, "pad": pad})
                    for i in range(start, min(count, start + 1000))
                ]
            )


def logger_for(mode: str, sink: Path) -> logging.Handler | None:
    """Point ``outrelay.events`` at ``sink`` as ``mode`` says; returns the handler to remove."""
    logger = logging.getLogger(LOGGER_NAME)
    logger.propagate = False
    if mode == "off":
        logger.setLevel(logging.WARNING)
        return None
    handler = logging.FileHandler(sink)
    fmt: logging.Formatter = (
        JsonFormatter()
        if mode.startswith("json")
        else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    handler.setFormatter(fmt)
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    return handler


async def relay_once(base: Path, work: Path, mode: str, count: int) -> tuple[float, int]:
    """Relay a copy of ``base``; returns (events/s, event log lines written)."""
    db = work / f"{mode.replace(' ', '_').replace('%', '')}.db"
    shutil.copy(base, db)
    sink = work / "events.log"
    sink.unlink(missing_ok=True)
    MemoryTransport._brokers.clear()
    raw: dict[str, Any] = {
        "outbox": {"url": f"sqlite:///{db}"},
        "destinations": {"mem": {"transport": "memory", "broker": "bench", "batch_size": 1000}},
    }
    if mode == "json 10%":
        raw["event_log"] = {"sample": 0.1}
    cfg = parse_config(raw)
    handler = logger_for(mode, sink)
    try:
        outbox = Outbox.open(cfg.outbox.url)
        t = time.perf_counter()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.perf_counter() - t
        outbox.close()
    finally:
        if handler is not None:
            logging.getLogger(LOGGER_NAME).removeHandler(handler)
            handler.close()
    got = len(MemoryTransport.broker("bench").all())
    assert got == count and summary.remaining == 0, (got, summary.remaining)
    lines = sum(1 for _ in sink.open()) if sink.exists() else 0
    db.unlink()
    return count / elapsed, lines


async def main_async(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as d:
        work = Path(d)
        base = work / "base.db"
        fill(base, args.count, args.streams, args.size)
        best: dict[str, float] = dict.fromkeys(MODES, 0.0)
        lines: dict[str, int] = {}
        for r in range(args.rounds):
            for mode in MODES if r % 2 == 0 else tuple(reversed(MODES)):
                rate, n = await relay_once(base, work, mode, args.count)
                best[mode] = max(best[mode], rate)
                lines[mode] = n
    assert lines["json"] == lines["text"] == args.count, lines
    print(
        f"relay SQLite -> memory, {args.count} events, {args.streams} streams, {args.size} B, "
        f"best of {args.rounds} rounds"
    )
    for mode in MODES:
        cost = (1 - best[mode] / best["off"]) * 100
        extra = "" if mode == "off" else f"  cost {cost:5.1f}%  ({lines[mode]} lines)"
        print(f"  event logs {mode:<9} {best[mode]:10,.0f} events/s{extra}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=50_000)
    ap.add_argument("--streams", type=int, default=100)
    ap.add_argument("--size", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
