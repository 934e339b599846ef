"""Robustness checks: refused targets, throttling, retries, dedupe over time, reopening, released sockets.

* ``refuse_target`` (hook): a batch mixing a target the broker refuses with
  good ones gives Rejected for the refused messages only.
* ``throttle`` (hook): a throttled broker's retry hint reaches the relay as
  ``RetryLater.retry_after``.
* A retry (``Message.attempt`` > 1) is the same event: same id, same fields;
  with native dedupe the broker keeps one copy.
* Native dedupe holds after a delay and after other messages, not only for
  an immediate resend.
* ``open()`` after ``close()`` works (the transport contract, docs/transports.md).
* Sockets and files are released: open/send/close and ``check()`` cycles,
  and failing ``open()``/``check()`` calls, leave the process with no more of
  them than before.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from outrelay.conformance._checks_fidelity import send_delivered
from outrelay.conformance._harness import CheckFailed, CheckSkipped, Context, assert_same, by_id, check, guarded
from outrelay.core.contract.transport import Delivered, Message, Rejected, RetryLater, Transport
from outrelay.core.model.errors import OutrelayError

__all__: list[str] = []

CYCLES = 3  # open/send/close cycles counted (each leaked socket shows at once; more cycles only cost time)
SETTLE = 0.3  # how long closed connections may take to leave /proc/self/fd (connection_lost callbacks)
DEDUPE_DELAY = 1.5
DEDUPE_BETWEEN = 50
HAVE_PROC_FD = Path("/proc/self/fd").is_dir()


@check
async def refused_target_mixed(ctx: Context) -> None:
    """In a batch mixing messages for a target the broker refuses with messages for a good target, the refused
    ones are Rejected (permanent) and every other one is Delivered and read back."""
    hook = ctx.ct.refuse_target
    if hook is None:
        raise ctx.no_hook("refuse_target")
    s = await ctx.session()
    bad = await ctx.hook("refuse_target()", hook(s.target), max(ctx.timeout, 30.0))
    events = [ctx.event(f"mixed-{i}", data={"i": i}) for i in range(5)]
    refused = {1, 3}
    batch = [Message(e, bad if i in refused else s.target, e.stream) for i, e in enumerate(events)]
    results = await guarded("send() of a mixed batch", s.transport.send(batch), ctx.timeout)
    if len(results) != len(batch):
        raise CheckFailed(f"send() of {len(batch)} messages returned {len(results)} results")
    for i, r in enumerate(results):
        want = Rejected if i in refused else Delivered
        if not isinstance(r, want):
            where = f"the refused target {bad!r}" if i in refused else "the good target"
            raise CheckFailed(f"result #{i} (to {where}) is {r!r}, expected {want.__name__} (all: {results!r})")
    good = [e for i, e in enumerate(events) if i not in refused]
    by_id(good, await s.expect(len(good)))
    await s.expect_nothing_more()


@check
async def throttle_retry_after(ctx: Context) -> None:
    """A broker that throttles answers RetryLater carrying its retry hint (retry_after, in seconds)."""
    hook = ctx.ct.throttle
    if hook is None:
        raise ctx.no_hook("throttle")
    s = await ctx.session()
    hint = await ctx.hook("throttle()", hook(s.target), ctx.timeout)
    [r] = await s.send([ctx.event("throttled", data=b"t")], what="send() to a throttled broker")
    if not isinstance(r, RetryLater):
        raise CheckFailed(f"send() to a throttled broker gave {r!r}; expected RetryLater")
    if r.retry_after is None or abs(r.retry_after - hint) > max(1.0, 0.1 * hint):
        raise CheckFailed(f"RetryLater.retry_after is {r.retry_after!r}; the broker's hint was {hint:g}s")


@check
async def retry_keeps_event_id(ctx: Context) -> None:
    """A retry (Message.attempt > 1) carries the same event: same id and fields; with native_dedupe a first
    attempt and its retry are read back once."""
    s = await ctx.session()
    first, other = ctx.event("retry-a", data=b"a"), ctx.event("retry-b", data=b"b")
    sends = [(first, 1), (first, 2), (other, 3)]
    for e, attempt in sends:
        what = f"send() of event {e.id!r} with attempt={attempt}"
        res = await guarded(what, s.transport.send([Message(e, s.transport.target(e), e.stream, attempt)]), ctx.timeout)
        if len(res) != 1 or not isinstance(res[0], Delivered):
            raise CheckFailed(f"{what} gave {res!r}, not one Delivered")
    want = 2 if s.caps.native_dedupe else 3
    got = await s.expect(want)
    ids = [g.event.id for g in got]
    if s.caps.native_dedupe and ids.count(first.id) != 1:
        raise CheckFailed(f"with native_dedupe, attempt 1 and attempt 2 of one event arrived {ids.count(first.id)}x")
    for g in got:
        assert_same([first if g.event.id == first.id else other], [g])
    await s.expect_nothing_more()


@check
async def dedupe_after_delay(ctx: Context) -> None:
    """With native_dedupe, a resend 1.5 s later, after 50 other messages, is still recognised (read back once):
    dedupe holds over its declared window, not only for an immediate resend."""
    s = await ctx.session()
    if not s.caps.native_dedupe:
        raise CheckSkipped("transport declares no native_dedupe")
    window = s.caps.dedupe_window
    if window is not None and window < 3 * DEDUPE_DELAY:
        raise CheckSkipped(f"dedupe_window={window}s is too short to resend within it after {DEDUPE_DELAY}s")
    first = ctx.event("dedupe-window", data=b"once")
    between = [ctx.event(f"between-{i % 5}", data={"i": i}) for i in range(DEDUPE_BETWEEN)]
    await send_delivered(s, [first], what="first send()")
    for i in range(0, len(between), s.caps.max_batch_count if s.caps.ordered_batches else 5):
        chunk = between[i : i + (s.caps.max_batch_count if s.caps.ordered_batches else 5)]
        await send_delivered(s, chunk, what="send() of the messages in between")
    await asyncio.sleep(DEDUPE_DELAY)
    res = await guarded(
        "resend after the delay",
        s.transport.send([Message(first, s.transport.target(first), first.stream, attempt=2)]),
        ctx.timeout,
    )
    if len(res) != 1 or not isinstance(res[0], Delivered):
        raise CheckFailed(f"the resend after {DEDUPE_DELAY}s gave {res!r}; expected Delivered (a duplicate is fine)")
    sentinel = ctx.event("dedupe-window", data=b"after")
    await send_delivered(s, [sentinel], what="send() after the resend")
    got = await s.expect(DEDUPE_BETWEEN + 2)
    ids = [g.event.id for g in got]
    if ids.count(first.id) != 1:
        raise CheckFailed(
            f"the event resent after {DEDUPE_DELAY}s and {DEDUPE_BETWEEN} other messages arrived "
            f"{ids.count(first.id)}x; dedupe_window={window} promises once"
        )
    await s.expect_nothing_more()


@check
async def reopen_after_close(ctx: Context) -> None:
    """open() after close() works: the reopened transport delivers, and its messages are read back."""
    s = await ctx.session()
    a, b = ctx.event("reopen", data=b"a"), ctx.event("reopen", data=b"b")
    await send_delivered(s, [a], what="send() before close()")
    await s.expect(1)
    await guarded("close()", s.transport.close(), ctx.timeout)
    try:
        await guarded("open() after close()", s.transport.open(), ctx.timeout)
    except OutrelayError as exc:
        raise CheckFailed(
            f"open() after close() raised {type(exc).__name__}: {exc}; the contract (docs/transports.md) says a "
            "closed transport may be opened again"
        ) from exc
    await send_delivered(s, [b], what="send() after reopening")
    assert_same([b], await s.expect(1))


def open_handles() -> dict[int, str]:
    """The process's open sockets and regular files: fd -> what it points at (Linux ``/proc/self/fd``)."""
    out: dict[int, str] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue  # closed meanwhile (or the listing's own fd)
        if link.startswith("socket:") or (link.startswith("/") and not link.startswith(("/dev/", "/proc/"))):
            out[int(name)] = link
    return out


async def _failing(ctx: Context, target: str, n: int) -> None:
    """Error paths, at once: open() and check() against a broker that is down, check() with credentials that may
    not publish — on new instances, never closed after a failure (a failed open()/check() must undo itself)."""

    async def fail_open(hook: str, make: Callable[[str], Transport]) -> None:
        t = ctx.adopt_made(hook, make(target))
        try:
            await guarded(f"open() against a down broker #{n}", t.open(), ctx.timeout)
        except OutrelayError:
            return
        await guarded(f"close() after a lazy open() #{n}", t.close(), ctx.timeout)  # it connects lazily

    async def fail_check(hook: str, make: Callable[[str], Transport]) -> None:
        t = ctx.adopt_made(hook, make(target))
        with contextlib.suppress(OutrelayError):
            await guarded(f"check() with {hook} #{n}", t.check(), ctx.timeout)

    jobs = []
    if ctx.ct.make_unreachable is not None:
        jobs.append(fail_open("make_unreachable", ctx.ct.make_unreachable))
        jobs += [fail_check("make_unreachable", ctx.ct.make_unreachable)]
    if ctx.ct.make_forbidden is not None:
        jobs += [fail_check("make_forbidden", ctx.ct.make_forbidden)]
    await asyncio.gather(*jobs)


async def _settled_handles(before: dict[int, str], settle: float = SETTLE) -> dict[int, str]:
    """The sockets/files open now and not ``before``, once at most one is left or ``settle`` seconds passed:
    a transport's ``connection_lost`` callbacks may still be running just after ``close()`` returned."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + settle
    while True:
        new = {fd: what for fd, what in open_handles().items() if before.get(fd) != what}
        if len(new) <= 1 or loop.time() >= deadline:
            return new
        await asyncio.sleep(0.02)


@check
async def sockets_released(ctx: Context) -> None:
    """Three open/send/close cycles, two check() calls, and the error paths (open() and check() against a broker
    that is down, check() with credentials that may not publish, never followed by close()) leave no more sockets
    or files open than before (counted in /proc/self/fd)."""
    if not HAVE_PROC_FD:
        raise CheckSkipped("this platform has no /proc/self/fd to count open sockets")
    s = await ctx.session()

    async def cycle(n: int) -> None:
        t = ctx.transport(s.target)
        await guarded(f"open() #{n}", t.open(), ctx.timeout)
        ev = ctx.event("sockets", data={"n": n})
        await guarded(f"send() #{n}", t.send([Message(ev, t.target(ev), ev.stream)]), ctx.timeout)
        await guarded(f"close() #{n}", t.close(), ctx.timeout)

    async def probe(n: int) -> None:
        t = ctx.transport(s.target)
        try:
            await guarded(f"check() #{n}", t.check(), ctx.timeout)
        finally:
            await guarded(f"close() after check() #{n}", t.close(), ctx.timeout)

    await cycle(0)  # warm-up: lazily created process-wide resources are not leaks
    await probe(0)
    await _failing(ctx, s.target, 0)
    await asyncio.sleep(0.2)
    before = open_handles()
    for n in range(1, CYCLES + 1):
        await cycle(n)
    for n in (1, 2):
        await probe(n)
    await _failing(ctx, s.target, 1)  # one round: each leak shows at once (more rounds only cost time)
    new = await _settled_handles(before)
    if len(new) > 1:
        kinds = sorted({w.split("[")[0] for w in new.values()})
        raise CheckFailed(
            f"{len(new)} more sockets/files are open after {CYCLES} open/send/close cycles, 2 check() calls, a round "
            f"of failed open()/check() than before ({', '.join(kinds)}); close() — and a failing open() or check() — "
            "must release every connection and file"
        )
