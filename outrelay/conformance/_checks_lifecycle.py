"""Lifecycle and error-classification checks: open/close, misuse, a broker that is down, bad targets.

A broker that is down must show up as *retryable* (RetryableError from
``open``/``send``, or RetryLater results) within a bound — never a hang,
never a vendor exception, never a permanent error that would dead-letter
events because of an outage.
"""

from __future__ import annotations

import uuid

from pydantic import ValidationError

from outrelay.conformance._checks_fidelity import send_delivered
from outrelay.conformance._harness import CheckFailed, CheckSkipped, Context, check, guarded, short
from outrelay.core.contract.transport import Delivered, Message, Rejected, RetryLater, Transport
from outrelay.core.model.errors import OutrelayError, RetryableError, TransportError, UsageError

__all__: list[str] = []


def _unreachable(ctx: Context, target: str) -> Transport:
    make = ctx.ct.make_unreachable
    if make is None:
        raise CheckSkipped("no make_unreachable given: cannot point the transport at a broker that is down")
    return ctx.adopt_made("make_unreachable", make(target))


@check
async def open_close(ctx: Context) -> None:
    """open(), send and read one message, then close() completes without error."""
    s = await ctx.session()
    ev = ctx.event("lifecycle", data=b"hello")
    await send_delivered(s, [ev])
    await s.expect(1)
    await guarded("close()", s.transport.close(), ctx.timeout)


@check
async def close_twice(ctx: Context) -> None:
    """close() is idempotent: on a never-opened transport, and twice after open()."""
    t = ctx.transport(await ctx.new_target())
    try:
        await guarded("close() before open()", t.close(), ctx.timeout)
    except OutrelayError as exc:
        raise CheckFailed(f"close() on a never-opened transport raised {type(exc).__name__}: {exc}") from exc
    await guarded("open()", t.open(), ctx.timeout)
    try:
        await guarded("first close()", t.close(), ctx.timeout)
        await guarded("second close()", t.close(), ctx.timeout)
    except OutrelayError as exc:
        raise CheckFailed(f"close() must be idempotent but raised {type(exc).__name__}: {exc}") from exc


@check
async def send_after_close(ctx: Context) -> None:
    """send() after close() raises outrelay.UsageError instead of sending or hanging."""
    s = await ctx.session(need_reader=False)
    ev = ctx.event("closed", data=b"x")
    if s.reader is not None:
        await send_delivered(s, [ev])
    else:  # nobody consumes the target: some brokers refuse the message, which is fine here
        await s.send([ev])
    await guarded("close()", s.transport.close(), ctx.timeout)
    try:
        results = await guarded("send() after close()", s.transport.send(s.messages([ev])), ctx.timeout)
    except UsageError:
        return
    except OutrelayError as exc:
        raise CheckFailed(f"send() after close() raised {type(exc).__name__}: {exc}; expected UsageError") from exc
    raise CheckFailed(f"send() after close() returned {short(results)}; expected it to raise UsageError")


@check
async def start_while_broker_down(ctx: Context) -> None:
    """Against a broker that is down, open() raises RetryableError within the bound, or (lazy connect)
    send() reports RetryLater/raises RetryableError; close() then works."""
    target = ctx.unique
    t = _unreachable(ctx, target)
    try:
        await guarded("open() against a down broker", t.open(), ctx.timeout)
    except RetryableError:
        await guarded("close() after a failed open()", t.close(), ctx.timeout)
        return
    except OutrelayError as exc:
        raise CheckFailed(
            f"open() against a down broker raised {type(exc).__name__}: {exc}; "
            "an outage must be a RetryableError (or connect lazily)"
        ) from exc
    # opened lazily: the outage must surface from send() as retryable
    ev = ctx.event("down", data=b"x")
    try:
        results = await guarded("send() to a down broker", t.send([Message(ev, t.target(ev), ev.stream)]), ctx.timeout)
    except RetryableError:
        results = []
    except OutrelayError as exc:
        raise CheckFailed(
            f"send() to a down broker raised {type(exc).__name__}: {exc}; expected RetryableError or RetryLater"
        ) from exc
    if results and not all(isinstance(r, RetryLater) for r in results):
        raise CheckFailed(f"send() to a down broker returned {short(results)}; expected RetryLater")
    await guarded("close()", t.close(), ctx.timeout)


@check
async def check_unreachable(ctx: Context) -> None:
    """check() against a broker that is down raises a TransportError with a message, within the bound."""
    t = _unreachable(ctx, ctx.unique)
    try:
        summary = await guarded("check() against a down broker", t.check(), ctx.timeout)
    except TransportError as exc:
        if not str(exc).strip():
            raise CheckFailed("check() raised a TransportError with an empty message; say what to fix") from exc
        return
    except OutrelayError as exc:
        raise CheckFailed(f"check() raised {type(exc).__name__}: {exc}; expected a TransportError") from exc
    raise CheckFailed(f"check() reported success against a broker that is down: {short(summary)}")


@check
async def malformed_target(ctx: Context) -> None:
    """A target the broker cannot accept (spaces, NUL, wildcards) yields outrelay errors or per-message
    results, never a vendor exception or a hang."""
    if not ctx.ct.isolated:
        raise CheckSkipped("all checks share one configured target, so no malformed target can be made")
    target = f"orconf bad\x00target <*>#? {uuid.uuid4().hex[:8]}"
    try:
        t = ctx.transport(target)
    except (OutrelayError, ValidationError):
        return  # rejected at configuration time: the best outcome
    ev = ctx.event("bad-target", data=b"x")
    try:
        rendered = t.target(ev)
    except Exception as exc:
        raise CheckFailed(f"target(event) raised {type(exc).__name__}: {exc}; it must never fail") from exc
    try:
        await guarded("open()", t.open(), ctx.timeout)
        results = await guarded(f"send() to {rendered!r}", t.send([Message(ev, rendered, ev.stream)]), ctx.timeout)
    except OutrelayError:
        return
    if len(results) != 1 or not isinstance(results[0], Delivered | RetryLater | Rejected):
        raise CheckFailed(f"send() returned {short(results)}; expected one SendResult")
