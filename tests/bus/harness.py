"""Members, publishing and checks for the shared subscriber suite."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson

from outrelay import Event, Outbox, Relay, load_config
from outrelay.core.consumer.bus import EventBus
from outrelay.core.consumer.subscriber import Subscription
from tests.bus._member import Recorder
from tests.bus.backends import BusBackend

__all__ = ["Harness", "Record", "events_for", "records_of"]

ROOT = Path(__file__).resolve().parents[2]
Record = dict[str, Any]


def events_for(count: int, streams: int) -> list[Event]:
    """``count`` events over ``streams`` streams; data carries the per-stream index ``i``."""
    return [Event(type="order.created", stream=f"s{n % streams}", data={"i": n // streams}) for n in range(count)]


def records_of(paths: list[Path]) -> list[Record]:
    """Every complete record in the members' files (a line still being written is left for the next read)."""
    out: list[Record] = []
    for p in paths:
        if p.exists():
            data = p.read_bytes()
            complete = data[: data.rfind(b"\n") + 1]
            out.extend(orjson.loads(line) for line in complete.splitlines() if line.strip())
    return out


class Member:
    """A group member or fan-out subscriber: a process (brokers) or a task (in-process bus)."""

    def __init__(self, name: str, out: Path) -> None:
        self.name = name
        self.out = out
        self.proc: subprocess.Popen[bytes] | None = None
        self.bus: EventBus | None = None
        self.sub: Subscription | None = None
        self.recorder: Recorder | None = None
        self.dying: asyncio.Future[None] | None = None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(self.proc.wait, 20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait, 10)
        if self.bus is not None:
            await self.bus.close(grace=1)
        if self.recorder is not None:
            self.recorder.close()


class Harness:
    """One backend, one config file (outbox, destination ``bus``, ``[bus]``), members, publishing."""

    claim_timeout = 3.0

    def __init__(self, backend: BusBackend, tmp_path: Path) -> None:
        self.backend = backend
        self.tmp = tmp_path
        self.outbox_url = f"sqlite:///{tmp_path}/outbox.db"
        self.config = tmp_path / "outrelay.toml"
        lines = [
            "[outbox]",
            f'url = "{self.outbox_url}"',
            "[bus]",
            'destination = "bus"',
            f'dead_letters = "sqlite:///{tmp_path}/consumer-dlq.db"',
            f"claim_timeout = {self.claim_timeout}",
            "[destinations.bus]",
            *(f"{k} = {_toml(v)}" for k, v in backend.options.items() if not isinstance(v, dict)),
        ]
        for k, v in backend.options.items():
            if isinstance(v, dict):
                lines += [f"[destinations.bus.{k}]", *(f"{kk} = {_toml(vv)}" for kk, vv in v.items())]
        self.config.write_text("\n".join(lines) + "\n")
        self.members: list[Member] = []

    def bus(self, member: str | None = None) -> EventBus:
        return EventBus.from_config(self.config, member=member)

    async def start_members(
        self, count: int, *, group: str | None, delay: float = 0.0, app_db: Path | None = None,
        crash_on: str | None = None, prefetch: int = 64,
    ) -> list[Member]:  # fmt: skip
        """Start ``count`` members and return once every one has subscribed."""
        made = [Member(f"m{len(self.members) + i}", self.tmp / f"m{len(self.members) + i}.jsonl") for i in range(count)]
        self.members.extend(made)
        if self.backend.processes:
            for m in made:
                cmd = [sys.executable, "-m", "tests.bus._member", "--config", str(self.config), "--name", m.name,
                       "--out", str(m.out), "--group", group or "", "--delay", str(delay),
                       "--prefetch", str(prefetch)]  # fmt: skip
                if app_db is not None:
                    cmd += ["--app-db", str(app_db)]
                if crash_on is not None:
                    cmd += ["--crash-on", crash_on]
                env = {**os.environ, "PYTHONPATH": str(ROOT)}
                m.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, env=env)  # noqa: ASYNC220 - a quick fork
            await asyncio.gather(*(asyncio.wait_for(asyncio.to_thread(_ready, m), 60) for m in made))
        else:
            for m in made:
                m.bus = self.bus(m.name)
                rec = Recorder(m.out, m.name, delay=delay, app_db=app_db, crash_on=crash_on, on_crash=_hang(m))
                m.recorder = rec
                m.sub = await m.bus.subscribe(rec, group=group, name=m.name, prefetch=prefetch)
        return made

    async def publish(self, events: list[Event]) -> None:
        """Append to the outbox and drain it through a relay to the destination."""
        outbox = Outbox.open(self.outbox_url)
        try:
            outbox.append(events)
            summary = await Relay(outbox, load_config(self.config)).run(drain=True)
            assert summary.remaining == 0 and summary.dead_lettered == 0, summary
        finally:
            outbox.close()

    def records(self, members: list[Member] | None = None) -> list[Record]:
        return records_of([m.out for m in (members or self.members)])

    async def wait_for(self, ids: set[str], members: list[Member] | None = None, timeout: float = 120.0) -> None:
        """Until every id in ``ids`` was handled by ``members`` (each, for fan-out: pass one)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            got = {r["id"] for r in self.records(members)}
            if ids <= got:
                return
            await asyncio.sleep(0.1)
        missing = ids - {r["id"] for r in self.records(members)}
        raise AssertionError(f"{len(missing)} of {len(ids)} events never handled within {timeout} s")

    async def close(self) -> None:
        await asyncio.gather(*(m.stop() for m in self.members), return_exceptions=True)


def _ready(m: Member) -> None:
    assert m.proc is not None and m.proc.stdout is not None
    line = m.proc.stdout.readline()
    if line.strip() != b"ready":
        raise AssertionError(f"member {m.name} did not start (exit {m.proc.poll()}): {line!r}")


def _hang(m: Member) -> Any:
    async def crash() -> None:  # a task member "dies": unsubscribe with no grace cancels this handler
        assert m.sub is not None
        m.dying = asyncio.ensure_future(m.sub.unsubscribe(grace=0))
        await asyncio.Event().wait()

    return crash


def _toml(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return str(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'
