"""In-process checks: cancellation, instances that share nothing, the caller's batch, durability.

* A send cancelled mid-batch raises ``CancelledError``; what it reported
  :class:`Delivered` to the send's progress (``outrelay.core.contract.progress``, when
  the running outrelay has it) is readable; afterwards the transport delivers
  again (or says it closed itself: UsageError, then ``close()``/``open()``).
* Two instances for two targets, sending at once, deliver each message to
  their own target only (no class-level or module-level state between them).
* ``send()`` leaves the caller's list and messages exactly as they were.
* A transport declaring ``delivery = "at_least_once"`` keeps what it
  delivered: a reader attached *after* the send finds it
  (``ConformanceTarget.late_reader``, else ``transport.reader(target)``).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Sequence
from typing import Any

from outrelay.conformance._checks_faults import BATCH, batch_events, message_size, rig
from outrelay.conformance._checks_fidelity import send_delivered
from outrelay.conformance._harness import (
    CheckFailed,
    CheckSkipped,
    Context,
    Session,
    assert_same,
    check,
    guarded,
)
from outrelay.core.contract.transport import Delivered, Message
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import OutrelayError, UsageError

__all__: list[str] = []

DELIVERY = ("at_least_once", "at_most_once")
#: loop iterations to let a send run before cancelling it, tried in turn until one lands mid-send
_CANCEL_AFTER = (1, 2, 4, 8, 16)
_RESENDS = 8


def _progress() -> Any:
    """``outrelay.core.contract.progress`` when this outrelay has it (the per-batch progress contract), else None."""
    try:
        return importlib.import_module("outrelay.core.contract.progress")
    except ImportError:
        return None


async def _cancel_once(s: Session, msgs: Sequence[Message], iterations: int | None, progress: Any) -> str:
    """Run ``send(msgs)`` as a task and cancel it (after ``iterations`` loop turns, or 0.2 s when None: the
    caller made the send stall). Returns ``"cancelled"``, ``"finished"`` (it ended before the cancel) or
    ``"swallowed"`` (it returned normally although cancelled).

    :raises CheckFailed: it did not end within the bound after the cancel, or raised something else."""
    mod = _progress()
    if mod is not None and progress is not None:
        with mod.sending(progress):  # the task copies the context: the transport finds the progress there
            task = asyncio.ensure_future(s.transport.send(msgs))
    else:
        task = asyncio.ensure_future(s.transport.send(msgs))
    if iterations is None:
        await asyncio.sleep(0.2)  # the stalled send is waiting for its confirmations by now
    for _ in range(iterations or 0):
        await asyncio.sleep(0)
    if task.done():
        if not task.cancelled():
            task.exception()  # retrieved: an error here is not what this check is about
        return "finished"
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=s.ctx.timeout)
    if not done:
        raise CheckFailed(f"a cancelled send() of {len(msgs)} messages had not ended {s.ctx.timeout:g}s later")
    if task.cancelled():
        return "cancelled"
    exc = task.exception()
    if exc is None:
        return "swallowed"
    raise CheckFailed(
        f"send() cancelled mid-batch raised {type(exc).__name__}: {exc} instead of CancelledError; let cancellation "
        "through unchanged"
    ) from exc


async def _usable_again(s: Session, events: Sequence[Event]) -> None:
    """Resend ``events`` until Delivered (bounded); a transport that closed itself may say UsageError once."""
    pending = list(events)
    for attempt in range(_RESENDS):
        if not pending:
            return
        await asyncio.sleep(0.1 * attempt)
        msgs = [Message(e, s.transport.target(e), e.stream, attempt + 2) for e in pending]
        try:
            results = await guarded("send() after a cancelled send()", s.transport.send(msgs), s.ctx.timeout)
        except UsageError:  # it closed itself on cancellation: it must reopen cleanly
            await guarded("close() after a cancelled send()", s.transport.close(), s.ctx.timeout)
            await guarded("open() after a cancelled send()", s.transport.open(), s.ctx.timeout)
            continue
        except OutrelayError:
            continue  # retryable for the whole batch: try again
        pending = [e for e, r in zip(pending, results, strict=True) if not isinstance(r, Delivered)]
    if pending:
        raise CheckFailed(
            f"after a cancelled send(), {len(pending)} message(s) were still not Delivered after {_RESENDS} resends; "
            "a cancelled send must leave the transport usable"
        )


async def _cancel_plan(ctx: Context) -> tuple[Session, Session, Any, Sequence[int | None]]:
    """(sending session, reading session, fault proxy or None, when to cancel) for :func:`cancel_mid_batch`."""
    if ctx.ct.upstream is None or ctx.ct.make_transport_via is None:
        s = await ctx.session()
        return s, s, None, _CANCEL_AFTER
    r = await rig(ctx)  # through a proxy that stalls midway: the send surely waits on confirmations when cancelled
    size = await message_size(r)
    r.proxy.stall_after(max(1, size * BATCH // 2))
    return r.via, r.direct, r.proxy, (None,)


@check
async def cancel_mid_batch(ctx: Context) -> None:
    """A send cancelled mid-batch raises CancelledError, nothing it reported Delivered is missing, and the
    transport is usable afterwards (or closed itself and opens again).

    Without the fault hooks the send is cancelled after 1, 2, 4... loop turns until a cancel lands mid-send;
    a cancel that lands just as the send completes can be lost by ``asyncio.wait_for`` on Python 3.11 (a
    CPython race, fixed in 3.12), so only a send that swallows every cancellation that landed fails."""
    s, reading, proxy, plan = await _cancel_plan(ctx)
    mod = _progress()
    outcomes: list[str] = []
    sent, seen = list[Event](), set[str]()
    for iterations in plan:
        batch = batch_events(ctx, s.caps.ordered_batches, min(BATCH, s.caps.max_batch_count))
        sent += batch
        msgs = s.messages(batch)
        progress = mod.Progress() if mod is not None else None
        outcomes.append(await _cancel_once(s, msgs, iterations, progress))
        if proxy is not None:
            proxy.release()
        if outcomes[-1] == "cancelled":
            got = [progress.outcome(m) for m in msgs] if progress is not None else []
            confirmed = {m.event.id for m, o in zip(msgs, got, strict=False) if isinstance(o, Delivered)}
            seen |= {g.event.id for g in await reading.read_until(confirmed, ctx.read_timeout, grace=0)}
            if confirmed - seen:
                raise CheckFailed(
                    f"{len(confirmed - seen)} message(s) the cancelled send() reported Delivered to its progress "
                    "cannot be read back; report Delivered only what the broker confirmed"
                )
            break
    if "cancelled" not in outcomes:
        if "swallowed" in outcomes:
            raise CheckFailed(
                f"send() of {BATCH} messages was cancelled mid-batch and returned results instead of raising "
                f"CancelledError ({outcomes.count('swallowed')} of {len(outcomes)} tries); let cancellation through "
                "(never swallow CancelledError)"
            )
        raise CheckSkipped("every send() finished before it could be cancelled (it never waits on the broker)")
    await _usable_again(s, sent)
    seen |= {g.event.id for g in await reading.read_until({e.id for e in sent} - seen, ctx.read_timeout, grace=0)}
    missing = [e.id for e in sent if e.id not in seen]
    if missing:
        raise CheckFailed(f"after the cancelled send() and resends, {len(missing)} message(s) never arrived")


@check
async def instances_isolated(ctx: Context) -> None:
    """Two instances of the transport, each for a target of its own, sending at once: every message lands in
    its own instance's target and nowhere else (instances share no mutable state)."""
    if not ctx.ct.isolated:
        raise CheckSkipped("all checks share one configured target, so no second target can be made")
    a = await ctx.session(suffix="a")
    b = await ctx.session(suffix="b")
    if a.target == b.target:
        raise CheckFailed(f"two targets made for this check both render to {a.target!r}")
    plans = {
        "a": [[ctx.event(f"inst-a{k}", data={"n": n}) for k in range(2)] for n in range(5)],
        "b": [[ctx.event(f"inst-b{k}", data={"n": n}) for k in range(2)] for n in range(5)],
    }

    async def sender(s: Session, batches: list[list[Event]]) -> None:
        for batch in batches:
            await send_delivered(s, batch, what=f"send() on the instance for {s.target!r}")

    await asyncio.gather(sender(a, plans["a"]), sender(b, plans["b"]))
    want = {k: {e.id for batch in plans[k] for e in batch} for k in plans}
    got = {
        k: [g.event.id for g in await s.read_until(want[k], ctx.read_timeout, grace=0.2)]
        for k, s in (("a", a), ("b", b))
    }
    for mine, theirs, s in (("a", "b", a), ("b", "a", b)):
        strays = [i for i in got[mine] if i in want[theirs]]
        if strays:
            raise CheckFailed(
                f"{len(strays)} of {len(want[theirs])} messages the other instance sent landed in {s.target!r}; "
                "instances must share no state (class attributes, module globals)"
            )
    for k, s in (("a", a), ("b", b)):
        missing = want[k] - set(got[k])
        if missing:
            raise CheckFailed(f"{len(missing)} of {len(want[k])} messages sent to {s.target!r} never arrived there")


@check
async def batch_left_unchanged(ctx: Context) -> None:
    """send() leaves the caller's batch as it was: the same list in the same order (not sorted, not
    consumed), the same Message objects, their events unchanged field by field."""
    s = await ctx.session()
    per_key = 2 if s.caps.ordered_batches else 1
    keys = ["k-zulu", "k-alpha", "k-mike", "k-bravo"]
    events = [
        ctx.event(k, data={"n": n}, metadata={"m": k}, subject="s", labels={"l": "v"})
        for n in range(per_key)
        for k in keys
    ]
    msgs = s.messages(events)
    batch, before = list(msgs), [(m, m.event.attributes(), m.event.data, m.target, m.key, m.attempt) for m in msgs]
    results = await guarded("send()", s.transport.send(batch), ctx.timeout)
    if len(results) != len(events):
        raise CheckFailed(f"send() of {len(events)} messages returned {len(results)} results")
    if [id(m) for m in batch] != [id(m) for m in msgs]:
        how = "reordered" if sorted(map(id, batch)) == sorted(map(id, msgs)) else "changed (items added or removed)"
        raise CheckFailed(f"send() {how} the caller's batch list in place; copy it if you need another order")
    for i, (m, attrs, data, target, key, attempt) in enumerate(before):
        now = (m.event.attributes(), m.event.data, m.target, m.key, m.attempt)
        if now != (attrs, data, target, key, attempt):
            raise CheckFailed(f"send() changed message #{i} of the caller's batch (event {m.event.id!r})")
    assert_same(events, await s.expect(len(events)))


@check
async def durable_late_reader(ctx: Context) -> None:
    """With delivery = at_least_once (the declared delivery semantics), messages sent while no reader is
    attached are found by a reader that attaches afterwards: Delivered means kept."""
    if not ctx.ct.isolated:
        raise CheckSkipped("all checks share one configured target: earlier checks' messages would be read too")
    target = await ctx.new_target()
    t = ctx.transport(target)
    caps = t.capabilities
    if caps.delivery not in DELIVERY:
        raise CheckFailed(f"capabilities.delivery is {caps.delivery!r}; declare one of {', '.join(DELIVERY)}")
    if caps.delivery == "at_most_once":
        raise CheckSkipped("transport declares delivery = at_most_once: nothing is kept for a reader attached later")
    if not caps.reader:
        raise CheckSkipped("transport declares no reader (capabilities.reader is false)")
    if ctx.ct.late_reader is None and "late_reader" in ctx.ct.unsupported:
        raise ctx.no_hook("late_reader")
    await guarded("open()", t.open(), ctx.timeout)
    events = [ctx.event(f"late-{i}", data={"i": i}) for i in range(4)]
    s = Session(ctx, t, caps, t.target(events[0]), None)
    await send_delivered(s, events, what="send() while no reader is attached")
    late = ctx.ct.late_reader(t, s.target) if ctx.ct.late_reader is not None else t.reader(s.target)
    s.reader = await ctx.start_reader(late)
    found = {g.event.id for g in await s.read_until({e.id for e in events}, ctx.read_timeout, grace=0)}
    if not found >= {e.id for e in events}:
        how = "ConformanceTarget.late_reader" if ctx.ct.late_reader is not None else "transport.reader(target)"
        raise CheckFailed(
            f"a reader attached after the send ({how}) found {len(found & {e.id for e in events})} of {len(events)} "
            "Delivered messages; with delivery = at_least_once Delivered must mean kept — declare delivery = "
            "'at_most_once' if the broker keeps nothing for absent readers, or give late_reader if your reader only "
            "sees new messages"
        )
