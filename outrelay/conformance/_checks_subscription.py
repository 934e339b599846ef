"""Consumer-side checks: a transport's subscription backend holds the contract of
:mod:`outrelay.core.contract.subscription`.

They run for a transport that declares ``capabilities.subscriptions`` and
drive ``transport.subscription(spec)`` as the subscriber runtime does
(:mod:`outrelay.conformance._subscribe`), with members in tasks of the
check's event loop and in processes of their own:

* a group hands each event to one member, each stream in order and with one
  member at a time (tasks and processes);
* a member killed (SIGKILL) or stopped while holding unacked events: another
  member is handed them within about ``claim_timeout``, in stream order,
  nothing lost; ``stop()`` is idempotent and an ack after it is ignored;
* fan-out subscribers each see every event published after ``start()``;
* a new group starts at the end of the target (``from_beginning``: at its
  beginning), and its position survives its members;
* a foreign message (not an outrelay CloudEvent, put there with the target's
  ``publish_foreign`` hook) comes back as data, never as an exception.

Sizes are small (a few dozen events) and members use the target's
``claim_timeout``, so each check takes seconds.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

from outrelay.conformance._harness import CheckFailed, CheckSkipped, Context, check, guarded
from outrelay.conformance._members import Handling, Member
from outrelay.conformance._subscribe import (
    HANDOVER_SLACK,
    Subscribing,
    exclusive,
    faithful,
    in_order,
    once,
)
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import OutrelayError

__all__: list[str] = []

HOLD = 0.005  # how long a member holds each message before acking it: long enough for an overlap to show
JOIN_HEAD = 0.1  # how long a second member has been joining when the first one dies or stops


def _ids(events: Sequence[Event]) -> set[str]:
    return {e.id for e in events}


async def _quiet(sub: Subscribing, members: Sequence[Member]) -> list[Handling]:
    """The members' handlings after ``sub.grace`` more seconds (a duplicate would show up now)."""
    await asyncio.sleep(sub.grace)
    return sub.handlings(members)


@check
async def subscription_group_tasks(ctx: Context) -> None:
    """Three members of one group in one process (each on a transport of its own) are handed every event once,
    each stream in order and with one member at a time, unchanged."""
    sub = await Subscribing.open(ctx)
    group = sub.group("g")
    members = await asyncio.gather(*(sub.member(f"m{i}", group, hold=HOLD) for i in range(3)))
    faithful(sub, await _shared(sub, members, sub.events(48, 8)))


@check
async def subscription_group_processes(ctx: Context) -> None:
    """Two members of one group, each in a process of its own, are handed every event once, each stream in order
    and with one member at a time."""
    sub = await Subscribing.open(ctx, needs=("processes",))
    group = sub.group("g")
    members = await asyncio.gather(*(sub.process(f"p{i}", group, hold=HOLD) for i in range(2)))
    await _shared(sub, members, sub.events(32, 8))


async def _shared(sub: Subscribing, members: Sequence[Member], events: list[Event]) -> list[Handling]:
    """Publish ``events`` to the group of ``members`` (started): every one must be handed to them
    within the delivery bound, once, each stream in order and to one member at a time. Returns
    the handlings.

    :raises CheckFailed: any of that does not hold."""
    await sub.publish(events)
    await sub.until(members, _ids(events), sub.deliver, "events published after start() returned")
    got = await _quiet(sub, members)
    once(sub, got)
    in_order(sub, got)
    exclusive(sub, got)
    return got


def _took(sub: Subscribing, held: set[str], got: Sequence[Handling], since: float) -> float:
    """When the last of ``held`` was first handed to a member of ``got``, in seconds after ``since``."""
    first: dict[str, float] = {}
    for h in got:
        if h.id in held:
            first[h.id] = min(first.get(h.id, h.received), h.received)
    return max(first.values()) - since


def _in_time(sub: Subscribing, took: float, what: str) -> None:
    """Fails unless ``took`` (seconds until another member had them) is within the handover bound."""
    bound = sub.handover
    if took > bound:
        raise CheckFailed(
            f"{what} reached another member {took:.1f}s later; the contract says within about claim_timeout "
            f"({sub.claim_timeout:g}s; allowed 2 * claim_timeout + {HANDOVER_SLACK:g}s = {bound:g}s)"
        )


async def _handed_over(
    ctx: Context,
    sub: Subscribing,
    first: list[Event],
    second: list[Event],
    held: set[str],
    gone: tuple[Member, float, str],
    to: Member,
    who: str,
) -> None:
    """After a member left (``gone``: it, when, and how: ``"killed"``/``"stopped"``) holding the
    events ``held`` of ``first``: publish ``second``, then ``to`` (named ``who`` in messages) must
    handle every event of both within the handover bound plus the read timeout, the held ones
    within the handover bound, each once and each stream in order, and no two members may have
    held one at a time.

    :raises CheckFailed: any of that does not hold."""
    left, left_at, how = gone
    await sub.publish(second)
    everything = _ids(first) | _ids(second)
    wait = sub.handover + ctx.read_timeout
    await sub.until([to], everything, wait, f"events (those the {how} member held included)")
    got = await _quiet(sub, [to])
    _in_time(sub, _took(sub, held, got, left_at), f"the last of the {len(held)} events the {how} member held")
    once(sub, got)
    in_order(sub, got, who)
    exclusive(sub, sub.handlings(), gone={left.name: left_at})


@check
async def subscription_member_killed(ctx: Context) -> None:
    """A member process killed (SIGKILL) while holding unacked events: a live member is handed every one of them
    within about claim_timeout, each stream in order, and nothing is lost."""
    sub = await Subscribing.open(ctx, needs=("processes",))
    group = sub.group("g")
    victim = await sub.process("victim", group, ack=False)
    first = sub.events(12, 4)
    await sub.publish(first)
    await sub.until_any(victim, sub.deliver, "the group's only member")
    # the victim dies while the survivor joins, soon after it took its events: a live member that holds events
    # longer than claim_timeout may lose them to another one (the contract's order holds while handlers keep up)
    joining = asyncio.ensure_future(sub.member("survivor", group, hold=HOLD))
    await asyncio.sleep(JOIN_HEAD)
    killed_at = await victim.kill()
    survivor = await joining
    held = {h.id for h in sub.handlings([victim])}
    second = sub.events(12, 4)
    await _handed_over(ctx, sub, first, second, held, (victim, killed_at, "killed"), survivor, "the survivor")


@check
async def subscription_stop_hands_over(ctx: Context) -> None:
    """stop() of a member holding unacked events hands them to a live member within about claim_timeout, each
    stream in order; stop() again returns at once and an ack after stop() is ignored."""
    sub = await Subscribing.open(ctx)
    group = sub.group("g")
    a = await sub.member("a", group, ack=False)
    first = sub.events(8, 4)
    await sub.publish(first)
    await sub.until([a], _ids(first), sub.deliver, "events published after start() returned")
    joining = asyncio.ensure_future(sub.member("b", group, hold=HOLD))  # a stops while b joins (see above)
    await asyncio.sleep(JOIN_HEAD)
    held = {h.id for h in sub.handlings([a])}
    stopped_at = time.monotonic()  # from here on what a holds is free for others
    await a.stop()
    b = await joining
    assert a.backend is not None
    await guarded("a second stop()", a.backend.stop(), ctx.timeout)
    try:
        await guarded("ack() after stop()", a.unacked[0].ack(), ctx.timeout)
    except OutrelayError as exc:
        raise CheckFailed(f"ack() after stop() raised {type(exc).__name__}: {exc}; it must be ignored") from None
    await _handed_over(ctx, sub, first, sub.events(8, 4), held, (a, stopped_at, "stopped"), b, "the member that stayed")


@check
async def subscription_fanout(ctx: Context) -> None:
    """Three fan-out subscribers each see every event published right after their start() returned (before they
    first called receive()), once, each stream in order, unchanged."""
    sub = await Subscribing.open(ctx)
    members = await asyncio.gather(*(sub.member(f"f{i}", None, run=False) for i in range(3)))
    events = [*sub.events(24, 4), sub.rich_event()]
    await sub.publish(events)
    for m in members:
        m.run()
    for m in members:
        await sub.until([m], _ids(events), sub.deliver, "events published after start() returned")
    await asyncio.sleep(sub.grace)
    for m in members:
        got = sub.handlings([m])
        once(sub, got)
        in_order(sub, got, f"fan-out subscriber {m.name}")
        faithful(sub, got)


@check
async def subscription_group_position(ctx: Context) -> None:
    """A new group starts at the end of the target: events published before its first start() never reach it;
    its position survives its members: what was published while none ran reaches the next, what was acked never
    comes back."""
    sub = await Subscribing.open(ctx)
    before = sub.events(4, 2, "before")
    for e in before:  # one per send: tansu 0.6 reports a partition's end one short after a batch of several
        await sub.publish([e])
    group = sub.group("g")
    a = await sub.member("a", group, run=False)
    after = sub.events(4, 2, "after")
    await sub.publish(after)
    a.run()
    await sub.until([a], _ids(after), sub.deliver, "events published after start() returned")
    old = [h for h in await _quiet(sub, [a]) if h.id in _ids(before)]
    if old:
        raise CheckFailed(
            f"a new group was handed {len(old)} event(s) published before its first start() "
            f"(e.g. {sub.label(old[0])}); a new group starts at the end of the target"
        )
    await sub.settled(a)
    await a.stop()
    later = sub.events(4, 2, "later")
    await sub.publish(later)
    b = await sub.member("b", group)
    await sub.until([b], _ids(later), sub.deliver, "events published while the group had no member")
    again = [h for h in await _quiet(sub, [b]) if h.id in _ids(before) | _ids(after)]
    if again:
        raise CheckFailed(
            f"the group's next member was handed {len(again)} event(s) acked before (e.g. {sub.label(again[0])}): "
            "the group's position must survive its members"
        )


@check
async def subscription_from_beginning(ctx: Context) -> None:
    """A new group with from_beginning starts at the target's beginning: it is handed the events published before
    its first start(), then the later ones, each stream in order."""
    if not ctx.ct.isolated:
        raise CheckSkipped("needs a target of its own: on a shared target the beginning holds other traffic")
    sub = await Subscribing.open(ctx, needs=("from_beginning",))
    before = sub.events(6, 2)
    await sub.publish(before)
    m = await sub.member("m", sub.group("g"), from_beginning=True)
    after = sub.events(4, 2)
    await sub.publish(after)
    await sub.until([m], _ids(before) | _ids(after), sub.deliver, "events (published before start() included)")
    got = await _quiet(sub, [m])
    once(sub, got)
    in_order(sub, got)


@check
async def subscription_foreign_message(ctx: Context) -> None:
    """A message that is not an outrelay CloudEvent (hook publish_foreign) reaches a group member and a fan-out
    subscriber as an Inbound with received=None and an error saying why, never as an exception; later events
    follow."""
    sub = await Subscribing.open(ctx, needs=("publish_foreign",))
    hook = ctx.ct.publish_foreign
    assert hook is not None
    members = [await sub.member("g", sub.group("g")), await sub.member("f", None)]
    await guarded("publish_foreign()", hook(sub.target), max(ctx.timeout, 30.0))
    after = sub.events(2, 1)
    await sub.publish(after)
    for m in members:
        await sub.until([m], _ids(after), sub.deliver, "events published after the foreign message")
        await sub.until_foreign(m)
        if m.retried is not None:
            raise CheckFailed(f"receive() of {m.name} raised {m.retried!r}; a foreign message must come back as data")
