"""A subscriber group member for the shared suite: in this process, or as ``python -m tests.bus._member``.

Every handled event becomes one JSON line in ``out``: event id, stream, the
per-stream index carried in the data, this member's name, and monotonic
start/end times (CLOCK_MONOTONIC is system-wide on Linux, so members in
different processes can be compared). With ``app_db`` the handler records
its effect and the inbox row in one SQLite transaction; ``crash_on`` makes
the member that commits that event die (``os._exit``) right after the
commit, before the ack (a member that finds it already handled does not).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import signal
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from outrelay import Event
from outrelay.core.consumer.bus import EventBus
from outrelay.core.consumer.inbox import Inbox

__all__ = ["Recorder", "run_member"]


def _wal(db: sqlite3.Connection) -> None:
    """Switch ``db`` to WAL. Members start together, and switching the journal mode fails at once
    with "database is locked" while another member's connection holds a lock (the busy timeout
    does not apply to it): retry for up to 10 s."""
    deadline = time.monotonic() + 10
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


class Recorder:
    """The handler: records, optionally applies effects idempotently, optionally crashes."""

    def __init__(
        self,
        out: Path,
        member: str,
        *,
        delay: float = 0.0,
        app_db: Path | None = None,
        crash_on: str | None = None,
        on_crash: Any = None,
    ) -> None:
        self.member = member
        self.delay = delay
        self.crash_on = crash_on
        self.on_crash = on_crash or (lambda: os._exit(9))
        self.app_db = app_db
        self.inbox = Inbox("suite")
        self._out = out.open("ab", buffering=0)
        if app_db is not None:
            with sqlite3.connect(app_db, timeout=30) as db:
                _wal(db)
                db.execute("CREATE TABLE IF NOT EXISTS effects (event_id TEXT, member TEXT)")
                self.inbox.create_table(db)

    def close(self) -> None:
        self._out.close()

    async def __call__(self, event: Event) -> None:
        start = time.monotonic()
        if self.delay:
            await asyncio.sleep(random.random() * self.delay)
        skipped = False
        if self.app_db is not None:
            skipped = not await asyncio.to_thread(self._apply, event)
        doc = {
            "id": event.id,
            "stream": event.stream,
            "i": orjson.loads(event.data)["i"],
            "member": self.member,
            "start": start,
            "end": time.monotonic(),
            "skipped": skipped,
        }
        self._out.write(orjson.dumps(doc) + b"\n")
        if event.id == self.crash_on and not skipped:  # the member that committed it dies before the ack
            await self.on_crash()

    def _apply(self, event: Event) -> bool:
        db = sqlite3.connect(self.app_db, timeout=30)  # type: ignore[arg-type]
        try:
            with db:
                if not self.inbox.claim(db, event):
                    return False
                db.execute("INSERT INTO effects VALUES (?, ?)", (event.id, self.member))
            return True
        finally:
            db.close()


async def run_member(args: argparse.Namespace) -> None:
    bus = EventBus.from_config(args.config, member=args.name)
    rec = Recorder(
        Path(args.out), args.name, delay=args.delay, app_db=Path(args.app_db) if args.app_db else None,
        crash_on=args.crash_on,
    )  # fmt: skip
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with bus:
        await bus.subscribe(rec, group=args.group or None, name=args.name, prefetch=args.prefetch)
        print("ready", flush=True)
        await stop.wait()
    rec.close()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--config", required=True)
    p.add_argument("--name", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--group", default="")
    p.add_argument("--delay", type=float, default=0.0)
    p.add_argument("--app-db", default="")
    p.add_argument("--crash-on", default=None)
    p.add_argument("--prefetch", type=int, default=64)
    asyncio.run(run_member(p.parse_args()))
    sys.exit(0)


if __name__ == "__main__":
    main()
