"""Members of a subscription for the consumer-side checks: tasks of the check's loop, or child processes.

* :class:`TaskMember` — a backend driven by a task of the check's event loop,
  on a transport instance of its own (members of one process);
* :class:`ProcessMember` — a backend in a child process
  (:mod:`outrelay.conformance._member`), rebuilt there as
  ``type(t)(t.config, destination=t.destination)`` from the transport the
  target's ``make_transport`` returns.

Both drive a backend as the runtime does: ``receive`` (at most 16 at a time,
0.2 s), then for each message in order: hold it ``hold`` seconds, then ack it
(``ack_nowait()``, else ``await ack()``), or never (``ack=False``: a stuck
member). Each message handed out becomes a :class:`Handling`. Every call into
a backend is bounded (:func:`~outrelay.conformance._harness.guarded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Protocol

import orjson

import outrelay
from outrelay.conformance._harness import CheckFailed, Context, guarded, short
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import RetryableError

__all__ = ["Handling", "Member", "MemberHost", "ProcessMember", "TaskMember"]

RECEIVE = 16  # messages asked per receive()
POLL = 0.2  # receive()'s timeout


@dataclasses.dataclass
class Handling:
    """One message a member was handed: ``received``/``acked`` are ``time.monotonic()`` values
    (``acked``: when the ack was called; None: never), ``n`` its number at that member, ``error`` a
    foreign message's reason."""

    id: str
    stream: str
    member: str
    n: int
    received: float
    acked: float | None = None
    error: str | None = None
    event: Event | None = None
    settled: bool = False  # the ack returned (task members only)


class MemberHost(Protocol):
    """What a member needs of its check (:class:`outrelay.conformance._subscribe.Subscribing`, which
    builds the members): the check's context, the target ``make_transport`` is given, and the bounds
    on a member's start and stop."""

    ctx: Context
    make_target: str
    start_bound: float
    stop_bound: float


class _Member:
    """What both kinds of member keep: their check, spec and name (the spec's member), how long
    each handling holds a message (``hold``), whether it acks (``ack``), and its handlings."""

    def __init__(self, sub: MemberHost, spec: SubscriptionSpec, *, hold: float, ack: bool) -> None:
        self.sub = sub
        self.spec = spec
        self.name = spec.member
        self.hold = hold
        self.ack = ack
        self.handlings: list[Handling] = []


class TaskMember(_Member):
    """A member driven by a task of this event loop (see the module docstring)."""

    def __init__(self, sub: MemberHost, spec: SubscriptionSpec, *, hold: float, ack: bool) -> None:
        super().__init__(sub, spec, hold=hold, ack=ack)
        self.unacked: list[Inbound] = []  # what a member that does not ack holds
        self.failure: BaseException | None = None
        self.retried: RetryableError | None = None  # the last RetryableError of receive() (allowed; for messages)
        self.retries = 0
        self.backend: SubscriptionBackend | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopped = False

    async def start(self) -> None:
        """``subscription(spec)`` on a new transport, and ``start()``; receiving begins with :meth:`run`."""
        t = self.sub.ctx.transport(self.sub.make_target)
        try:
            self.backend = t.subscription(self.spec)
        except NotImplementedError as exc:
            raise CheckFailed(f"capabilities.subscriptions is true but subscription() raised: {exc}") from exc
        if not isinstance(self.backend, SubscriptionBackend):
            raise CheckFailed(f"subscription() returned {short(self.backend)}, not a SubscriptionBackend")
        await guarded(f"start() of member {self.name}", self.backend.start(), self.sub.start_bound)

    def run(self) -> None:
        """Start receiving (a task of this loop), once."""
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        try:
            await self._receive()
        except Exception as exc:  # the check sees it at its next poll()
            self.failure = exc

    async def _receive(self) -> None:
        assert self.backend is not None
        held = 0
        timeout = POLL + self.sub.ctx.timeout
        while True:
            room = self.spec.prefetch - held
            if room <= 0:  # a member that acks nothing stops asking once its prefetch is full (as the runtime does)
                await asyncio.sleep(0.05)
                continue
            try:
                call = self.backend.receive(min(RECEIVE, room), POLL)
                batch = await guarded(f"receive() of {self.name}", call, timeout)
            except RetryableError as exc:  # allowed (connection lost): the runtime backs off and calls again
                self.retries += 1
                self.retried = exc
                await asyncio.sleep(0.1)
                continue
            now = time.monotonic()
            for m in _inbounds(batch):
                got = m.received
                h = Handling(got.event.id if got else "", m.stream, self.name, len(self.handlings), now, None, m.error)
                h.event = got.event if got else None
                self.handlings.append(h)
                if self.hold:
                    await asyncio.sleep(self.hold)
                if not self.ack:
                    held += 1
                    self.unacked.append(m)
                    continue
                h.acked = time.monotonic()
                if not m.ack_nowait():
                    await guarded(f"ack() of {self.name}", m.ack(), self.sub.ctx.timeout)
                h.settled = True

    async def stop(self) -> None:
        """Stop receiving (cancel the loop, as the runtime does), then ``stop()`` the backend."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])  # its outcome is in self.failure; a cancellation of ours propagates
        if self.backend is not None and not self._stopped:
            self._stopped = True
            await guarded(f"stop() of member {self.name}", self.backend.stop(), self.sub.stop_bound)

    def poll(self) -> list[Handling]:
        """What this member was handed so far; fails when its receiving failed."""
        exc = self.failure
        if isinstance(exc, CheckFailed):
            raise CheckFailed(f"member {self.name}: {exc}")
        if exc is not None:
            where = "; ".join(getattr(exc, "__notes__", ())) or "receiving"
            raise CheckFailed(f"member {self.name}: {where}: {type(exc).__name__}: {exc}")
        return self.handlings


class ProcessMember(_Member):
    """A member in a child process (see the module docstring and :mod:`outrelay.conformance._member`)."""

    def __init__(self, sub: MemberHost, spec: SubscriptionSpec, *, hold: float, ack: bool) -> None:
        super().__init__(sub, spec, hold=hold, ack=ack)
        self.out = sub.ctx.tmp_path / f"{sub.ctx.unique}-{self.name}.jsonl"
        self.err = sub.ctx.tmp_path / f"{sub.ctx.unique}-{self.name}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.killed = False
        self._read = 0

    def _job(self) -> bytes:
        t = self.sub.ctx.transport(self.sub.make_target)
        cls, config = type(t), t.config
        imports = [(m.__name__, getattr(m, "__file__", None)) for m in map(sys.modules.get, _modules(cls, config)) if m]
        job = {
            "transport": (cls, config, t.destination),
            "spec": self.spec,
            "out": str(self.out),
            "hold": self.hold,
            "ack": self.ack,
        }
        try:
            blob = pickle.dumps(job)
        except Exception as exc:
            raise CheckFailed(
                f"cannot hand the transport to a member process: pickling {cls.__name__} and its config failed "
                f"({type(exc).__name__}: {exc}); a member process rebuilds it as cls(config, destination=...), or "
                "declare unsupported={'processes': why} when its members cannot live in other processes"
            ) from None
        return pickle.dumps({"path": list(sys.path), "imports": imports, "job": blob})

    async def start(self) -> None:
        """Start the child and wait until its ``start()`` returned (its ``ready`` line)."""
        job = self._job()
        root = str(Path(outrelay.__file__).parents[1])
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        with self.err.open("wb") as err:
            command = [sys.executable, "-m", "outrelay.conformance._member"]
            pipe = subprocess.PIPE
            self.proc = subprocess.Popen(command, stdin=pipe, stdout=pipe, stderr=err, env=env)  # noqa: ASYNC220 - quick
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        stdout = proc.stdout
        proc.stdin.write(job)
        proc.stdin.close()
        try:
            async with asyncio.timeout(self.sub.start_bound + 10.0):  # + a fresh interpreter's imports
                line = await asyncio.to_thread(stdout.readline)
        except TimeoutError:
            bound = self.sub.start_bound + 10
            raise CheckFailed(f"member process {self.name} did not start within {bound:g}s") from None
        if line.strip() != b"ready":
            await asyncio.to_thread(proc.wait, 10)
            raise CheckFailed(f"member process {self.name} did not start: {self.stderr() or f'exit {proc.returncode}'}")

    def stderr(self) -> str:
        """The last line the child wrote on stderr (why it failed), or ``""``."""
        text = self.err.read_text("utf-8", "replace").strip() if self.err.exists() else ""
        return text.splitlines()[-1][:400] if text else ""

    def poll(self) -> list[Handling]:
        """Read what the child recorded since the last poll; fails when the child died by itself."""
        code = self.proc.poll() if self.proc is not None else None
        if code not in (None, 0) and not self.killed:
            raise CheckFailed(f"member process {self.name} failed: {self.stderr() or f'exit {code}'}")
        if not self.out.exists():
            return self.handlings
        data = self.out.read_bytes()
        end = data.rfind(b"\n") + 1
        for line in data[self._read : end].splitlines():
            doc = orjson.loads(line)
            if "a" in doc:
                self.handlings[doc["a"]].acked = doc["t"]
            else:
                self.handlings.append(Handling(doc["id"], doc["s"], self.name, doc["n"], doc["t"], None, doc["e"]))
        self._read = max(self._read, end)
        return self.handlings

    async def kill(self) -> float:
        """SIGKILL the child (it acks nothing more, stops nothing); returns when it was killed (monotonic)."""
        assert self.proc is not None
        self.killed = True
        at = time.monotonic()
        self.proc.kill()
        await asyncio.to_thread(self.proc.wait, 10)
        return at

    async def stop(self) -> None:
        """SIGTERM: the child stops its backend and exits; killed if it does not within the bound."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            await asyncio.to_thread(proc.wait, self.sub.stop_bound)
        except subprocess.TimeoutExpired:
            proc.kill()
            await asyncio.to_thread(proc.wait, 10)
            bound = self.sub.stop_bound
            raise CheckFailed(f"member process {self.name}: stop() did not return within {bound:g}s") from None
        if proc.returncode != 0:
            raise CheckFailed(f"member process {self.name} failed: {self.stderr() or f'exit {proc.returncode}'}")

    async def close(self) -> None:
        """Stop the child if it still runs (killed when that fails), release its pipe; errors ignored."""
        if self.proc is not None:
            with contextlib.suppress(Exception):
                await self.stop()
            if self.proc.poll() is None:
                self.proc.kill()
                await asyncio.to_thread(self.proc.wait, 10)
            if self.proc.stdout is not None:
                self.proc.stdout.close()


Member = TaskMember | ProcessMember


def _modules(cls: type, config: object) -> list[str]:
    """The modules a member process imports first: the transport's and its config's (deduplicated)."""
    return list(dict.fromkeys([cls.__module__, type(config).__module__]))


def _inbounds(batch: object) -> list[Inbound]:
    """``batch`` when it is a list of Inbound, each decoded or saying why not; else the check fails."""
    if not isinstance(batch, list):
        raise CheckFailed(f"receive() returned {short(batch)}, not a list of Inbound")
    out: list[Inbound] = []
    for m in batch:
        if not isinstance(m, Inbound):
            raise CheckFailed(f"receive() returned {short(m)} in its list, not an Inbound")
        if m.received is None and not (isinstance(m.error, str) and m.error):
            raise CheckFailed(f"receive() returned an Inbound with received=None and no error saying why: {short(m)}")
        out.append(m)
    return out
