"""The setting of the consumer-side checks: a target to consume, its members, what they must show.

A :class:`Subscribing` is one check's setting: a fresh target with an opened
transport that publishes to it, and members consuming it through
``transport.subscription(spec)`` (:mod:`outrelay.conformance._members`: tasks
of the check's loop, or child processes). A transport whose state is not all
in its config (an in-process broker) cannot have member processes and says so
with ``unsupported={"processes": why}`` on the target, or
``conformance_unsupported = {"processes": why}`` on its class. The checks
compare what members were handed with what was published (:func:`once`,
:func:`in_order`, :func:`exclusive`, :func:`faithful`); every member is
stopped or killed when the check ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from outrelay.conformance._harness import CheckFailed, CheckSkipped, Context, Session, diff_events, guarded, short
from outrelay.conformance._members import Handling, Member, ProcessMember, TaskMember
from outrelay.core.contract.subscription import SubscriptionSpec
from outrelay.core.contract.transport import Delivered, Transport
from outrelay.core.model.envelope import Event

__all__ = ["Subscribing", "exclusive", "faithful", "in_order", "once", "unsupported"]

PREFETCH = 32
#: the handover bound is 2 * claim_timeout + this: the broker drops a dead member after claim_timeout, and a
#: rebalance, lease renewal or claim sweep comes on top (a Kafka group: a session timeout, then a rebalance round)
HANDOVER_SLACK = 2.0
#: the ConformanceTarget hooks ``Subscribing.open(needs=...)`` may name
HOOKS = ("publish_foreign",)
#: how a skip names what ``Subscribing.open(needs=...)`` found unsupported
NEEDS = {"processes": "member processes", "from_beginning": "from_beginning"}


def unsupported(ctx: Context, t: Transport, what: str) -> str | None:
    """Why the target (``unsupported``) or the transport class (``conformance_unsupported``) cannot do ``what``."""
    declared = getattr(type(t), "conformance_unsupported", None) or {}
    reason = ctx.ct.unsupported.get(what) or declared.get(what)
    return str(reason) if reason else None


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
        #: how long a check keeps listening after the last expected event (duplicates, strays): a peer that
        #: delivers within a short read_timeout shows them sooner
        self.grace = min(0.3, ctx.read_timeout / 10)
        self.members: list[Member] = []
        self.index: dict[str, tuple[str, int]] = {}  # event id -> (stream, index in the stream)
        self.sent: dict[str, Event] = {}
        self._count: dict[str, int] = defaultdict(int)

    @classmethod
    async def open(cls, ctx: Context, needs: Sequence[str] = ()) -> Subscribing:
        """A fresh target and an opened publisher. Skips unless the transport declares subscriptions, and
        when the target or transport class declares one of ``needs`` unsupported (or, for a hook such as
        ``publish_foreign``, the target does not give it)."""
        name: str | None = None
        try:  # never opened: only asked for its capabilities, before anything is provisioned for nothing
            probe = ctx.ct.make_transport(ctx.unique)
        except Exception:  # a factory that wants a provisioned target (a URL, a queue that must exist)
            name = await ctx.new_target()
            probe = ctx.transport(name)
        if not isinstance(probe, Transport):
            raise CheckFailed(f"make_transport returned {type(probe).__name__}, not an outrelay.Transport")
        if not probe.capabilities.subscriptions:
            raise CheckSkipped("transport declares no subscriptions (capabilities.subscriptions is false)")
        for need in needs:
            if need in HOOKS and getattr(ctx.ct, need) is None:
                raise ctx.no_hook(need)
            reason = unsupported(ctx, probe, need)
            if reason is not None:
                raise CheckSkipped(f"the target declares no {NEEDS.get(need, need)}: {reason}")
        name = name or await ctx.new_target()
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
        """The spec of a member on this check's target (``kw``: ``prefetch``, ``from_beginning``)."""
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

        def missing() -> set[str]:
            return ids - {h.id for h in self.handlings(members)}

        names = ", ".join(m.name for m in members)
        await self._poll(
            lambda: not missing(),
            timeout,
            lambda: (
                f"{len(missing())} of {len(ids)} {what} never reached {names} within {timeout:g}s{self.why(members)}"
            ),
        )
        return self.handlings(members)

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
        notes = [
            f"{m.name}: receive() raised {m.retried!r} ({m.retries}x)"
            for m in members
            if isinstance(m, TaskMember) and m.retried is not None
        ]
        return f" ({'; '.join(notes)})" if notes else ""

    def label(self, h: Handling) -> str:
        """``stream#index`` of a handled event, for failure messages."""
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
