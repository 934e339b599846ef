"""Network faults the v2 proxy could not make: a connect that never completes, a reply lost after the write.

* :class:`~._proxy.SynBlackHole` is an address whose SYNs the kernel drops (a
  full accept queue): ``connect()`` itself hangs, where the v2 black hole
  accepted the connection and went silent. A transport without a connect
  timeout passes the one and hangs in the other.
* ``TcpProxy.drop_reply`` forwards a send whole and drops only the broker's
  answer: the broker applied the write, the transport never hears so. The
  results must be retryable (or Delivered, if the transport re-sent by itself
  and got an answer), a resend must succeed, and a transport declaring
  ``native_dedupe`` must not have the event stored twice.

``connect_black_hole`` needs only ``make_transport_via`` (the transport
pointed at a host and port): it runs for brokers whose clients a proxy cannot
stay in front of (Kafka, Pulsar), which is why it is not named ``fault_*``
(test modules skip those by name for such brokers). ``fault_reply_lost``
needs ``upstream`` too. It also fails a transport that re-sends a message
the broker confirmed before the fault (stored twice, dedupe or not).
"""

from __future__ import annotations

import asyncio
from collections import Counter

from outrelay.conformance._checks_faults import (
    batch_events,
    check_into_hole,
    faulted_send,
    open_into_hole,
    rig,
)
from outrelay.conformance._harness import CheckFailed, Context, check
from outrelay.conformance._proxy import SynBlackHole
from outrelay.core.contract.transport import Delivered

__all__: list[str] = []

_HOLE = "an address that never completes the TCP handshake"
_RESENDS = 8


@check
async def connect_black_hole(ctx: Context) -> None:
    """Against an address where TCP connections never complete (every SYN dropped), open() raises
    RetryableError (or connects lazily and the first send() is retryable) and check() raises a TransportError,
    both within the bound: the connect itself has a timeout."""
    if ctx.ct.make_transport_via is None:
        raise ctx.no_hook("make_transport_via", "the transport cannot be pointed at another address")
    target = await ctx.new_target()
    hole = SynBlackHole()
    ctx.on_close(hole.stop)
    port = await asyncio.to_thread(hole.start)
    made = [ctx.ct.make_transport_via(target, "127.0.0.1", port) for _ in range(2)]
    opener, checker = (ctx.adopt_made("make_transport_via", t) for t in made)
    # at once: each waits for the transport's connect timeout, which may be most of the bound
    await asyncio.gather(open_into_hole(ctx, opener, _HOLE), check_into_hole(ctx, checker, _HOLE))


@check
async def fault_reply_lost(ctx: Context) -> None:
    """The broker applies a send but its reply is lost (the proxy drops the answer and cuts the link): results
    are retryable or Delivered, resending succeeds, and with native_dedupe each event is stored once."""
    r = await rig(ctx)
    events = batch_events(ctx, r.via.caps.ordered_batches, 3)
    r.proxy.drop_reply()
    results = await faulted_send(r.via, events, "send() whose reply was lost")
    r.proxy.reply_armed = False  # a transport that answered without waiting for the broker never tripped it
    pending = [e for e, x in zip(events, results, strict=True) if not isinstance(x, Delivered)]
    for attempt in range(_RESENDS):
        if not pending:
            break
        await asyncio.sleep(0.1 * attempt)
        res = await faulted_send(r.via, pending, f"resend #{attempt + 1} after the lost reply")
        pending = [e for e, x in zip(pending, res, strict=True) if not isinstance(x, Delivered)]
    if pending:
        raise CheckFailed(f"{len(pending)} message(s) not Delivered after {_RESENDS} resends following a lost reply")
    got = await r.direct.read_until({e.id for e in events}, ctx.read_timeout, grace=0.3)
    copies = Counter(g.event.id for g in got)
    if copies[r.warm]:
        raise CheckFailed(
            "the warm-up message, confirmed before the fault, arrived again after the reconnect: never re-send "
            "what the broker confirmed"
        )
    missing = [e.id for e in events if not copies[e.id]]
    if missing:
        raise CheckFailed(f"{len(missing)} of {len(events)} messages never arrived after the lost reply and resends")
    twice = [i for i, n in copies.items() if n > 1]
    if twice and r.via.caps.native_dedupe:
        raise CheckFailed(
            f"{len(twice)} event(s) stored {max(copies.values())}x after a reply was lost and the message re-sent; "
            "with native_dedupe a re-send of the same event id must not be stored twice (send the broker's dedupe id "
            "on every attempt, including your own retries after a reconnect)"
        )
