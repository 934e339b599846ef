"""The machinery of the consumer-side checks: a target to consume, members, what they handled.

A :class:`Subscribing` is one check's setting: a fresh target with an opened
transport that publishes to it, and members consuming it through
``transport.subscription(spec)``:

* :class:`TaskMember` — a backend driven by a task of the check's event loop,
  each on a transport instance of its own (members of one process);
* :class:`ProcessMember` — a backend in a child process
  (:mod:`outrelay.conformance._member`), rebuilt there as
  ``type(t)(t.config, destination=t.destination)`` from the transport the
  target's ``make_transport`` returns. A transport whose state is not all in
  its config (an in-process broker) cannot be certified this way and says so
  with ``unsupported={"processes": why}`` on the target, or
  ``conformance_unsupported = {"processes": why}`` on its class.

Both drive a backend as the runtime does: ``receive`` (at most 16 at a time,
0.2 s), then for each message in order: hold it ``hold`` seconds, then ack
it (``ack_nowait()``, else ``await ack()``), or never (``ack=False``: a stuck
member). Each message handed out becomes a :class:`Handling`; the checks
compare them with what was published (:func:`once`, :func:`in_order`,
:func:`exclusive`, :func:`faithful`). Every call into a backend is bounded
(:func:`~outrelay.conformance._harness.guarded`); every member is stopped or
killed when the check ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import os
import pickle
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson

import outrelay
from outrelay.conformance._harness import (
    CheckFailed,
    CheckSkipped,
    Context,
    Session,
    diff_events,
    guarded,
    short,
)
from outrelay.core.envelope import Event
from outrelay.core.errors import RetryableError
from outrelay.core.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.transport import Delivered, Transport

__all__ = ["Handling", "ProcessMember", "Subscribing", "TaskMember", "exclusive", "faithful", "in_order", "once"]

RECEIVE = 16  # messages asked per receive()
POLL = 0.2  # receive()'s timeout
PREFETCH = 32
#: the handover bound is 2 * claim_timeout + this: the broker drops a dead member after claim_timeout, and a
#: rebalance, lease renewal or claim sweep comes on top (a Kafka group: a session timeout, then a rebalance round)
HANDOVER_SLACK = 2.0
#: how a skip names what ``Subscribing.open(needs=...)`` found unsupported
NEEDS = {"processes": "member processes", "from_beginning": "from_beginning"}


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


def unsupported(ctx: Context, t: Transport, what: str) -> str | None:
    """Why the target (``unsupported``) or the transport class (``conformance_unsupported``) cannot do ``what``."""
    declared = getattr(type(t), "conformance_unsupported", None) or {}
    reason = ctx.ct.unsupported.get(what) or declared.get(what)
    return str(reason) if reason else None


class TaskMember:
    """A member driven by a task of this event loop (see the module docstring)."""

    def __init__(self, sub: Subscribing, spec: SubscriptionSpec, *, hold: float, ack: bool) -> None:
        self.sub = sub
        self.spec = spec
        self.name = spec.member
        self.hold = hold
        self.ack = ack
        self.handlings: list[Handling] = []
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
        if self._task is None:
            self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        try:
            await self._receive()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # the check sees it at its next poll()
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
            with contextlib.suppress(BaseException):
                await self._task
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


class ProcessMember:
    """A member in a child process (see the module docstring and :mod:`outrelay.conformance._member`)."""

    def __init__(self, sub: Subscribing, spec: SubscriptionSpec, *, hold: float, ack: bool) -> None:
        self.sub = sub
        self.spec = spec
        self.name = spec.member
        self.hold = hold
        self.ack = ack
        self.out = sub.ctx.tmp_path / f"{sub.ctx.unique}-{self.name}.jsonl"
        self.err = sub.ctx.tmp_path / f"{sub.ctx.unique}-{self.name}.stderr"
        self.proc: subprocess.Popen[bytes] | None = None
        self.handlings: list[Handling] = []
        self.killed = False
        self._read = 0

    def _job(self) -> bytes:
        t = self.sub.ctx.transport(self.sub.make_target)
        cls, config = type(t), t.config
        imports = [(m.__name__, getattr(m, "__file__", None)) for m in map(sys.modules.get, _modules(cls, config)) if m]
        job = {"transport": (cls, config, t.destination), "spec": self.spec, "out": str(self.out), "hold": self.hold,
               "ack": self.ack}  # fmt: skip
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
            self.proc = subprocess.Popen(  # noqa: ASYNC220 - a fork and exec: quick
                [sys.executable, "-m", "outrelay.conformance._member"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, env=env,
            )  # fmt: skip
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


class Subscribing:
    """One check's target, its publishing transport, and its members (see the module docstring)."""

    def __init__(self, ctx: Context, session: Session, make_target: str) -> None:
        self.ctx = ctx
        self.session = session
        self.make_target = make_target  # what make_transport was given
        self.target = session.target  # what the transport renders: SubscriptionSpec.target
        self.claim_timeout = ctx.ct.claim_timeout
        # joining a group may wait for a rebalance (Kafka: up to about two session timeouts)
        self.start_bound = ctx.timeout + 2 * self.claim_timeout
        self.stop_bound = ctx.timeout + self.claim_timeout
        #: how long published events may take to reach a member that is receiving
        self.deliver = ctx.read_timeout + self.claim_timeout
        #: how long a dead or stopped member's events may take to reach another one ("about claim_timeout")
        self.handover = 2 * self.claim_timeout + HANDOVER_SLACK
        self.members: list[Member] = []
        self.index: dict[str, tuple[str, int]] = {}  # event id -> (stream, index in the stream)
        self.sent: dict[str, Event] = {}
        self._count: dict[str, int] = defaultdict(int)

    @classmethod
    async def open(cls, ctx: Context, needs: Sequence[str] = ()) -> Subscribing:
        """A fresh target and an opened publisher. Skips unless the transport declares subscriptions, and
        when the target or transport class declares one of ``needs`` unsupported."""
        probe = ctx.ct.make_transport(ctx.unique)  # never opened: only asked for its capabilities
        if not isinstance(probe, Transport):
            raise CheckFailed(f"make_transport returned {type(probe).__name__}, not an outrelay.Transport")
        if not probe.capabilities.subscriptions:
            raise CheckSkipped("transport declares no subscriptions (capabilities.subscriptions is false)")
        for need in needs:
            reason = unsupported(ctx, probe, need)
            if reason is not None:
                raise CheckSkipped(f"the target declares no {NEEDS.get(need, need)}: {reason}")
        name = await ctx.new_target()
        return cls(ctx, await _session(ctx, name), name)

    def group(self, tag: str) -> str:
        """A group name unique to this check; ``forget_group`` is awaited for it when the check ends."""
        name = f"{self.ctx.unique}-{tag}"
        forget = self.ctx.ct.forget_group
        if forget is not None:
            target = self.target
            self.ctx.on_close(lambda: forget(target, name))
        return name

    def spec(self, member: str, group: str | None, **kw: Any) -> SubscriptionSpec:
        kw.setdefault("prefetch", PREFETCH)
        return SubscriptionSpec(self.target, group, member, claim_timeout=self.claim_timeout, **kw)

    def events(self, count: int, streams: int, tag: str = "s") -> list[Event]:
        """``count`` events over ``streams`` streams, their per-stream index remembered."""
        out = []
        for k in range(count):
            stream = f"{tag}{k % streams}"
            i = self._count[stream]
            self._count[stream] += 1
            ev = self.ctx.event(stream, data={"i": i})
            self.index[ev.id] = (stream, i)
            self.sent[ev.id] = ev
            out.append(ev)
        return out

    async def publish(self, events: Sequence[Event]) -> None:
        """Send ``events`` as one batch; every one must be Delivered."""
        for e in events:
            self.sent.setdefault(e.id, e)
        results = await self.session.send(events, what="send() of the events to consume")
        bad = [(e.id, r) for e, r in zip(events, results, strict=True) if not isinstance(r, Delivered)]
        if bad:
            raise CheckFailed(f"publishing for the subscription check failed: {short(bad, 200)}")

    async def member(
        self, name: str, group: str | None, *, hold: float = 0.0, ack: bool = True, run: bool = True, **spec: Any
    ) -> TaskMember:
        """A started task member (receiving at once when ``run``); stopped when the check ends."""
        m = TaskMember(self, self.spec(name, group, **spec), hold=hold, ack=ack)
        self.members.append(m)
        self.ctx.on_close(_quietly(m.stop))
        await m.start()
        if run:
            m.run()
        return m

    async def process(self, name: str, group: str, *, hold: float = 0.0, ack: bool = True) -> ProcessMember:
        """A started member in a child process, receiving at once; killed when the check ends."""
        m = ProcessMember(self, self.spec(name, group), hold=hold, ack=ack)
        self.members.append(m)
        self.ctx.on_close(m.close)
        await m.start()
        return m

    def handlings(self, members: Iterable[Member] | None = None) -> list[Handling]:
        """What ``members`` (default: all) were handed so far, this check's events only on a shared target."""
        out = [h for m in (self.members if members is None else members) for h in m.poll()]
        return out if self.ctx.ct.isolated else [h for h in out if h.id in self.index or h.error]

    async def until(self, members: Sequence[Member], ids: set[str], timeout: float, what: str) -> list[Handling]:
        """Wait until ``members`` together were handed every id of ``ids``; fails naming what is missing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            got = self.handlings(members)
            missing = ids - {h.id for h in got}
            if not missing:
                return got
            if loop.time() >= deadline:
                names = ", ".join(m.name for m in members)
                raise CheckFailed(f"{len(missing)} of {len(ids)} {what} never reached {names} within {timeout:g}s"
                                  f"{self.why(members)}")  # fmt: skip
            await asyncio.sleep(0.02)

    async def until_any(self, member: Member, timeout: float, who: str) -> None:
        """Wait until ``member`` was handed anything; fails naming ``who`` it is."""
        await self._poll(
            lambda: bool(self.handlings([member])),
            timeout,
            lambda: f"{who} ({member.name}) was handed nothing within {timeout:g}s{self.why([member])}",
        )

    async def until_foreign(self, member: Member) -> None:
        """Wait until ``member`` was handed a foreign message (an Inbound with an error)."""
        await self._poll(
            lambda: any(h.error for h in self.handlings([member])),
            self.deliver,
            lambda: (
                f"the foreign message never reached {member.name} as an Inbound with received=None and an "
                f"error within {self.deliver:g}s{self.why([member])}"
            ),
        )

    async def settled(self, member: TaskMember) -> None:
        """Wait until every ack ``member`` called returned."""
        await self._poll(
            lambda: all(h.settled for h in member.poll() if h.acked is not None),
            self.ctx.timeout,
            lambda: f"acks of {member.name} did not return within {self.ctx.timeout:g}s",
        )

    async def _poll(self, done: Callable[[], bool], timeout: float, failure: Callable[[], str]) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            if loop.time() >= deadline:
                raise CheckFailed(failure())
            await asyncio.sleep(0.02)

    def rich_event(self) -> Event:
        """An event with every envelope field set and binary data (stream ``rich``, index 0)."""
        ev = self.ctx.event(
            "rich",
            tenant="acme",
            subject="line/1",
            correlation_id="corr-1",
            causation_id="cause-1",
            event_version="2",
            schema_version="3",
            producer_version="1.4.0",
            labels={"region": "eu"},
            tags=("vip",),
            metadata={"trace": "t-1"},
            data=b"\x00\x01binary\xff",
            content_type="application/octet-stream",
        )
        self.index[ev.id] = ("rich", 0)
        self.sent[ev.id] = ev
        return ev

    def why(self, members: Iterable[Member]) -> str:
        """What the members' last receive() raised, if anything (for failure messages)."""
        notes = [f"{m.name}: receive() raised {m.retried!r} ({m.retries}x)" for m in members
                 if isinstance(m, TaskMember) and m.retried is not None]  # fmt: skip
        return f" ({'; '.join(notes)})" if notes else ""

    def label(self, h: Handling) -> str:
        stream, i = self.index.get(h.id, (h.stream, -1))
        return f"{stream}#{i}"


async def _session(ctx: Context, target: str) -> Session:
    """An opened transport on ``target`` with a reader when there is one (on some brokers, AMQP, the
    reader's queue is what makes the target routable before any member exists)."""
    t = ctx.transport(target)
    await guarded("open()", t.open(), ctx.timeout)
    actual = t.target(ctx.event())
    caps = t.capabilities
    return Session(ctx, t, caps, actual, await ctx.reader(t, actual) if caps.reader else None)


def _quietly(stop: Callable[[], Any]) -> Callable[[], Any]:
    async def run() -> None:
        with contextlib.suppress(Exception):
            await stop()

    return run


# -- what the handlings must show --------------------------------------------------------------------------------------


def once(sub: Subscribing, got: Sequence[Handling]) -> None:
    """No event was handed out twice."""
    first: dict[str, Handling] = {}
    for h in sorted(got, key=lambda h: h.received):
        if h.id and h.id in first:
            a = first[h.id]
            raise CheckFailed(
                f"event {sub.label(h)} was handed out twice (to {a.member}, then {h.member} "
                f"{h.received - a.received:.2f}s later) although no member failed"
            )
        first[h.id] = h


def _lanes(sub: Subscribing, got: Sequence[Handling]) -> dict[str, list[Handling]]:
    """Per stream, the first handing-out of each event, in the order they were handed out."""
    seen: set[str] = set()
    lanes: dict[str, list[Handling]] = defaultdict(list)
    for h in sorted(got, key=lambda h: (h.received, h.member, h.n)):
        if h.id in sub.index and h.id not in seen:
            seen.add(h.id)
            lanes[sub.index[h.id][0]].append(h)
    return lanes


def in_order(sub: Subscribing, got: Sequence[Handling], who: str = "the group") -> None:
    """Per stream, events were first handed out in stream order."""
    for stream, lane in _lanes(sub, got).items():
        indexes = [sub.index[h.id][1] for h in lane]
        if indexes != sorted(indexes):
            raise CheckFailed(f"stream {stream!r} was handed to {who} out of order: {indexes[:12]}")


def exclusive(sub: Subscribing, got: Sequence[Handling], gone: Mapping[str, float] | None = None) -> None:
    """A stream's next event never reached a member while its previous one was unacked at another
    (``gone``: member -> when it died or stopped, which releases what it held)."""
    for stream, lane in _lanes(sub, got).items():
        for a, b in itertools.pairwise(lane):
            release = a.acked if a.acked is not None else (gone or {}).get(a.member)
            if a.member != b.member and (release is None or b.received < release):
                held = "never acked" if release is None else f"released {release - b.received:.3f}s later"
                raise CheckFailed(
                    f"stream {stream!r}: {sub.label(b)} reached {b.member} while {sub.label(a)} was unacked at "
                    f"{a.member} ({held}); a stream's events must stay with one member until acked"
                )


def faithful(sub: Subscribing, got: Sequence[Handling]) -> None:
    """Every event handed out is the event that was sent, field by field."""
    for h in got:
        sent = sub.sent.get(h.id)
        if h.event is None or sent is None:
            continue
        problems = diff_events(sent, h.event, sequence=False)
        if problems:
            raise CheckFailed(f"event {sub.label(h)} reached {h.member} changed: " + "; ".join(problems[:4]))
        if h.stream != sent.stream:
            raise CheckFailed(f"Inbound.stream of {sub.label(h)} is {h.stream!r}, expected the event's stream")
