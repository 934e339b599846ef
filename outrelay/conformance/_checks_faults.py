"""Fault checks: a TCP proxy the suite controls sits between the transport and its broker.

The transport under test is built with ``make_transport_via(target, "127.0.0.1",
proxy_port)``; the reader is a second transport connected to the broker
directly, so what the broker holds is read past the proxy. The proxy cuts or
resets connections (idle, or midway through a batch), black-holes them
(accepts, never answers) or stalls mid-request. Every check demands:

* every call returns within ``ConformanceTarget.timeout`` (a transport's own
  timeouts must be below it) and raises nothing but outrelay errors;
* an outage is *retryable*: results are :class:`Delivered` or
  :class:`RetryLater`, or the call raises :class:`RetryableError` — never
  :class:`Rejected`/``PermanentError``, which would dead-letter events;
* every message reported Delivered is readable, and per key what arrived is a
  prefix of what was sent (a lost connection loses a tail, never a hole);
* once the fault is healed, resending what was not Delivered succeeds within
  a few attempts (the transport reconnects by itself) and, per key, first
  arrivals are in send order (redeliveries are allowed: at-least-once).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from collections.abc import Sequence

from outrelay.conformance._checks_fidelity import binary_payload
from outrelay.conformance._harness import CheckFailed, Context, Session, check, guarded, short
from outrelay.conformance._proxy import TcpProxy
from outrelay.core.contract.transport import Delivered, RetryLater, SendResult, Transport
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import OutrelayError, RetryableError, TransportError

__all__: list[str] = []

BATCH = 8
PAYLOAD = 512
RECOVERY_ATTEMPTS = 8


@dataclasses.dataclass
class FaultRig:
    """A transport through ``proxy`` (``via``) and a direct session whose reader reads the broker."""

    ctx: Context
    proxy: TcpProxy
    direct: Session
    via: Session
    seen: set[str] = dataclasses.field(default_factory=set)
    #: the id of the warm-up message, confirmed and read before any fault ("" without one)
    warm: str = ""


def _hooks(ctx: Context) -> None:
    if ctx.ct.upstream is None or ctx.ct.make_transport_via is None:
        missing = "upstream" if ctx.ct.upstream is None else "make_transport_via"
        raise ctx.no_hook(missing, "no fault proxy can sit between transport and broker")


async def _proxy_for(ctx: Context, target: str) -> TcpProxy:
    assert ctx.ct.upstream is not None
    host, port = ctx.ct.upstream(target)
    proxy = TcpProxy(host, port)
    await proxy.start()
    ctx.on_close(proxy.stop)
    return proxy


def _via(ctx: Context, target: str, proxy: TcpProxy) -> Transport:
    assert ctx.ct.make_transport_via is not None
    return ctx.adopt_made("make_transport_via", ctx.ct.make_transport_via(target, "127.0.0.1", proxy.port))


async def rig(ctx: Context, *, warm: bool = True) -> FaultRig:
    """A direct session (reader) and an opened transport through a fresh proxy; ``warm``: one message
    already went through (connections are up, ``proxy.stats['bytes_up']`` holds its size)."""
    _hooks(ctx)
    direct = await ctx.session()
    proxy = await _proxy_for(ctx, direct.target)
    t = _via(ctx, direct.target, proxy)
    await guarded("open() through the proxy", t.open(), ctx.timeout)
    via = Session(ctx, t, direct.caps, direct.target, direct.reader)
    if not warm:
        return FaultRig(ctx, proxy, direct, via)
    ev = payload_event(ctx, "warm-up")
    [r] = await via.send([ev], what="send() through a healthy proxy")
    if not isinstance(r, Delivered):
        raise CheckFailed(f"send() through a healthy proxy (no fault yet) gave {r!r}")
    await via.expect(1)
    return FaultRig(ctx, proxy, direct, via, warm=ev.id)


def payload_event(ctx: Context, stream: str, n: int = 0) -> Event:
    return ctx.event(stream, data=binary_payload(PAYLOAD), content_type="application/octet-stream", sequence=n + 1)


def batch_events(ctx: Context, caps_ordered: bool, n: int = BATCH) -> list[Event]:
    """``n`` events: one key when the transport takes ordered batches, else one key each."""
    return [payload_event(ctx, "fault-k" if caps_ordered else f"fault-k{i}", i) for i in range(n)]


async def faulted_send(s: Session, events: Sequence[Event], what: str) -> list[SendResult | None]:
    """Send during a fault: one result per event (``None``: the call raised RetryableError).

    :raises CheckFailed: a hang, a vendor exception, or anything permanent."""
    try:
        results: list[SendResult | None] = list(await s.send(events, what=what))
    except RetryableError:
        return [None] * len(events)
    except OutrelayError as exc:
        raise CheckFailed(
            f"{what} raised {type(exc).__name__}: {exc}; a network fault must be retryable (RetryableError)"
        ) from exc
    bad = [r for r in results if not isinstance(r, Delivered | RetryLater)]
    if bad:
        raise CheckFailed(f"{what} gave {bad[0]!r}; a network fault must give RetryLater (retryable), never that")
    return results


async def assert_no_hole(r: FaultRig, events: Sequence[Event], results: Sequence[SendResult | None]) -> None:
    """Everything Delivered is readable; per key, what arrived is a prefix of what was sent."""
    delivered = {e.id for e, res in zip(events, results, strict=True) if isinstance(res, Delivered)}
    got = await r.direct.read_until(delivered, r.ctx.read_timeout)  # grace: what arrived unconfirmed
    seen = {g.event.id for g in got}
    lost = [e.id for e in events if e.id in delivered and e.id not in seen]
    if lost:
        raise CheckFailed(
            f"{len(lost)} message(s) reported Delivered during the fault cannot be read back (e.g. {lost[0]!r}); "
            "Delivered must mean the broker has it"
        )
    if r.direct.caps.ordering_by_key:
        per_key: dict[str, list[Event]] = defaultdict(list)
        for e in events:
            per_key[e.stream].append(e)
        for key, evs in per_key.items():
            arrived = [e.id in seen for e in evs]
            if False in arrived and True in arrived[arrived.index(False) :]:
                hole = arrived.index(False)
                raise CheckFailed(
                    f"key {key!r}: message #{hole} of the batch was lost but a later one arrived — a lost "
                    f"connection may lose a tail, never leave a hole (arrived: {arrived})"
                )
    r.seen |= seen


async def recover(r: FaultRig, events: Sequence[Event], results: Sequence[SendResult | None]) -> None:
    """Resend what was not Delivered until it is (bounded), then read back everything not yet seen."""
    ctx, via = r.ctx, r.via
    pending = [e for e, res in zip(events, results, strict=True) if not isinstance(res, Delivered)]
    for attempt in range(RECOVERY_ATTEMPTS):
        if not pending:
            break
        await asyncio.sleep(0.1 * attempt)
        res = await faulted_send(via, pending, f"send() #{attempt + 2} after the fault healed")
        pending = [e for e, x in zip(pending, res, strict=True) if not isinstance(x, Delivered)]
    if pending:
        raise CheckFailed(
            f"{len(pending)} message(s) still not Delivered after the fault healed and {RECOVERY_ATTEMPTS} resends; "
            "a transport must reconnect by itself"
        )
    rest = {e.id for e in events} - r.seen
    seen = {g.event.id for g in await via.read_until(rest, ctx.read_timeout, grace=0)}
    missing = sorted(rest - seen)
    if missing:
        raise CheckFailed(
            f"after recovery {len(missing)} of {len(events)} messages never arrived (e.g. {missing[0]!r})"
        )


async def idle_fault(ctx: Context, rst: bool) -> None:
    r = await rig(ctx)
    if rst:
        r.proxy.reset()
    else:
        r.proxy.cut()
    events = batch_events(ctx, r.via.caps.ordered_batches)
    what = f"send() after the proxy {'reset' if rst else 'cut'} every connection"
    results = await faulted_send(r.via, events, what)
    await assert_no_hole(r, events, results)
    await recover(r, events, results)


async def message_size(r: FaultRig) -> int:
    """Client→server bytes one :func:`payload_event` costs on the transport's open connection (a probe)."""
    before = r.proxy.stats["bytes_up"]  # the connection is up: the next message shows its own size
    [x] = await r.via.send([probe := payload_event(r.ctx, "size-probe")], what="send() through a healthy proxy")
    if not isinstance(x, Delivered):
        raise CheckFailed(f"send() through a healthy proxy (no fault yet) gave {x!r}")
    await r.via.read_until({probe.id}, r.ctx.read_timeout, grace=0)
    return max(1, r.proxy.stats["bytes_up"] - before)


async def mid_batch_fault(ctx: Context, *, rst: bool = False, stall: bool = False) -> None:
    r = await rig(ctx)
    one = await message_size(r)
    events = batch_events(ctx, r.via.caps.ordered_batches)
    midway = max(1, one * len(events) // 2)
    if stall:
        r.proxy.stall_after(midway)
    else:
        r.proxy.cut_after(midway, rst=rst)
    kind = "stalled" if stall else ("reset" if rst else "cut")
    results = await faulted_send(r.via, events, f"send() of {len(events)} messages {kind} after ~{midway} bytes")
    if r.proxy.armed:
        raise CheckFailed(f"the batch sent fewer than {midway} bytes, so the fault never fired (proxy {r.proxy.stats})")
    if stall:
        if all(isinstance(x, Delivered) for x in results):
            raise CheckFailed("every message was reported Delivered while the link was stalled mid-batch")
        r.proxy.release()
    await assert_no_hole(r, events, results)
    await recover(r, events, results)


@check
async def fault_cut_idle(ctx: Context) -> None:
    """After open(), the proxy drops every connection; the next batch is Delivered or retryable, everything
    Delivered is readable, and resends succeed once the transport reconnects by itself."""
    await idle_fault(ctx, rst=False)


@check
async def fault_reset_idle(ctx: Context) -> None:
    """After open(), the proxy resets every connection (TCP RST); the next batch is Delivered or retryable,
    never a vendor exception, and the transport recovers by itself."""
    await idle_fault(ctx, rst=True)


@check
async def fault_cut_mid_batch(ctx: Context) -> None:
    """The connection is cut halfway through a batch: results are Delivered or retryable, every Delivered is
    readable, per key a tail is lost but never a hole, and resending the rest succeeds."""
    await mid_batch_fault(ctx)


@check
async def fault_reset_mid_batch(ctx: Context) -> None:
    """The connection is reset (RST) halfway through a batch: the same guarantees as a cut."""
    await mid_batch_fault(ctx, rst=True)


@check
async def fault_stall_mid_batch(ctx: Context) -> None:
    """The link goes silent halfway through a batch: send() returns within the bound with retryable results,
    and after the link heals everything Delivered is readable and the rest goes through."""
    await mid_batch_fault(ctx, stall=True)


@check
async def fault_black_hole_send(ctx: Context) -> None:
    """While the network is a black hole (connections accepted, nothing answered), send() returns within the
    bound with RetryLater or RetryableError; after it heals, resends succeed."""
    r = await rig(ctx)
    r.proxy.hold()
    r.proxy.cut()  # open connections die: a reconnect meets the black hole
    events = batch_events(ctx, r.via.caps.ordered_batches, 3)
    results = await faulted_send(r.via, events, "send() into a black hole")
    if any(isinstance(x, Delivered) for x in results):
        raise CheckFailed(f"send() into a black hole reported Delivered ({short(results)}); nothing reached the broker")
    r.proxy.release()
    await recover(r, events, results)


async def open_into_hole(ctx: Context, t: Transport, hole: str) -> None:
    """open() into ``hole`` raises RetryableError within the bound (or connects lazily, and the first send()
    is retryable); close() then returns promptly."""
    try:
        await guarded(f"open() through {hole}", t.open(), ctx.timeout)
    except RetryableError:
        await guarded("close() after a failed open()", t.close(), ctx.timeout)
        return
    except OutrelayError as exc:
        raise CheckFailed(f"open() through {hole} raised {type(exc).__name__}: {exc}; expected RetryableError") from exc
    ev = ctx.event("hole", data=b"x")
    s = Session(ctx, t, t.capabilities, t.target(ev), None)
    results = await faulted_send(s, [ev], f"send() through {hole} after a lazy open()")
    if any(isinstance(x, Delivered) for x in results):
        raise CheckFailed(f"send() through {hole} reported Delivered; nothing reached the broker")
    await guarded(f"close() after {hole}", t.close(), ctx.timeout)


async def check_into_hole(ctx: Context, t: Transport, hole: str) -> None:
    """check() into ``hole`` raises a TransportError with a message within the bound."""
    try:
        summary = await guarded(f"check() through {hole}", t.check(), ctx.timeout)
    except TransportError as exc:
        if not str(exc).strip():
            raise CheckFailed("check() raised a TransportError with an empty message; say what to fix") from exc
        return
    except OutrelayError as exc:
        raise CheckFailed(
            f"check() through {hole} raised {type(exc).__name__}: {exc}; expected a TransportError"
        ) from exc
    raise CheckFailed(f"check() reported success through {hole}: {short(summary)}")


@check
async def fault_black_hole_open(ctx: Context) -> None:
    """open() through a black hole raises RetryableError within the bound (or connects lazily and the first
    send() is retryable within the bound); close() then returns promptly."""
    _hooks(ctx)
    target = await ctx.new_target()
    proxy = await _proxy_for(ctx, target)
    proxy.hold()
    await open_into_hole(ctx, _via(ctx, target, proxy), "a black hole")


@check
async def fault_black_hole_check(ctx: Context) -> None:
    """check() through a black hole raises a TransportError with a message within the bound (no hang)."""
    _hooks(ctx)
    target = await ctx.new_target()
    proxy = await _proxy_for(ctx, target)
    proxy.hold()
    await check_into_hole(ctx, _via(ctx, target, proxy), "a black hole")
