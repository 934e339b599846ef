"""Flow checks: batches, partial failure, per-key order, concurrency, dedupe, and the relay end to end."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from outrelay.conformance._checks_fidelity import binary_payload, max_size_or_skip, not_disabling, send_delivered
from outrelay.conformance._harness import CheckFailed, CheckSkipped, Context, Session, by_id, check
from outrelay.core.config.config import OutrelayConfig, RelayConfig
from outrelay.core.contract.transport import Delivered, Received, Rejected, RetryLater
from outrelay.core.model.envelope import Event
from outrelay.core.relay.relay import Relay
from outrelay.core.stores.outbox import Outbox

__all__: list[str] = []

KEYS = 16
GROUPS = 4
E2E_EVENTS = 300
E2E_STREAMS = 10


def assert_order(events: Sequence[Event], got: Sequence[Received]) -> None:
    """Per stream, messages arrived in the order they were sent."""
    want: dict[str, list[str]] = defaultdict(list)
    for e in events:
        want[e.stream].append(e.id)
    seen: dict[str, list[str]] = defaultdict(list)
    for r in got:
        seen[r.event.stream].append(r.event.id)
    for stream, ids in want.items():
        if seen[stream] != ids:
            pos = next((i for i, (a, b) in enumerate(zip(ids, seen[stream], strict=False)) if a != b), len(ids))
            raise CheckFailed(
                f"stream {stream!r}: message #{pos} out of order (received {len(seen[stream])} of {len(ids)}; "
                f"sent order {[i[-6:] for i in ids[:8]]}, received {[i[-6:] for i in seen[stream][:8]]})"
            )


def _chunks(events: Sequence[Event], size: int) -> list[Sequence[Event]]:
    return [events[i : i + size] for i in range(0, len(events), max(1, size))]


@check
async def batch_send(ctx: Context) -> None:
    """A batch of several messages gives one Delivered per message, in order, and all are read back."""
    s = await ctx.session()
    n = min(10, s.caps.max_batch_count)
    events = [ctx.event(f"batch-{i}", data={"i": i}) for i in range(n)]
    await send_delivered(s, events, what=f"send() of a batch of {n}")
    by_id(events, await s.expect(n))


@check
async def batch_partial_failure(ctx: Context) -> None:
    """In a batch with one oversized message, that one is Rejected and every other message is Delivered."""
    s = await ctx.session()
    size = max_size_or_skip(ctx, s)
    n = min(5, s.caps.max_batch_count)
    if n < 3:
        raise CheckSkipped(f"max_batch_count={s.caps.max_batch_count} is too small for a partial batch")
    bad = n // 2
    events = [ctx.event(f"part-{i}", data=binary_payload(size + 1) if i == bad else {"i": i}) for i in range(n)]
    results = await s.send(events, what=f"send() of a batch of {n} with message #{bad} oversized")
    for i, r in enumerate(results):
        ok = isinstance(r, Rejected) if i == bad else isinstance(r, Delivered)
        if not ok:
            want = "Rejected" if i == bad else "Delivered"
            raise CheckFailed(f"batch result #{i} is {r!r}, expected {want} (results: {results!r})")
        if isinstance(r, Rejected):
            not_disabling(r, f"the oversized message #{i} of a batch")
    good = [e for i, e in enumerate(events) if i != bad]
    by_id(good, await s.expect(len(good)))
    await s.expect_nothing_more()


@check
async def ordered_batch_halts_key(ctx: Context) -> None:
    """With ordered_batches, once a message of a key fails no later message of that key in the batch is
    delivered (RetryLater), while other keys go through."""
    s = await ctx.session()
    if not s.caps.ordered_batches:
        raise CheckSkipped("transport declares no ordered_batches (the relay sends one message per key per batch)")
    size = max_size_or_skip(ctx, s)
    if s.caps.max_batch_count < 4:
        raise CheckSkipped(f"max_batch_count={s.caps.max_batch_count} is too small")
    a, big, c = (ctx.event("halt-k1", data=d) for d in (b"a", binary_payload(size + 1), b"c"))
    d = ctx.event("halt-k2", data=b"d")
    results = await s.send([a, big, c, d], what="send() of [k1:a, k1:oversized, k1:c, k2:d]")
    want = (Delivered, Rejected, RetryLater, Delivered)
    if not all(isinstance(r, w) for r, w in zip(results, want, strict=True)):
        raise CheckFailed(f"results {results!r}; expected Delivered, Rejected, RetryLater, Delivered")
    rejected = results[1]
    assert isinstance(rejected, Rejected)
    not_disabling(rejected, "the oversized message of an ordered batch")
    by_id([a, d], await s.expect(2))
    await s.expect_nothing_more()


async def _send_all(s: Session, events: Sequence[Event]) -> None:
    for chunk in _chunks(events, s.caps.max_batch_count):
        await send_delivered(s, chunk)


@check
async def per_key_order(ctx: Context) -> None:
    """Order per key holds with 16 keys interleaved, several concurrent send() calls in flight (each with
    different keys), and several messages per key in one batch when ordered_batches is declared."""
    s = await ctx.session()
    if not s.caps.ordering_by_key:
        raise CheckSkipped("transport declares no ordering by key (capabilities.ordering_by_key is false)")
    per_batch = 3 if s.caps.ordered_batches else 1
    rounds = 2 if s.caps.ordered_batches else 4
    keys = [f"key-{k:02d}" for k in range(KEYS)]
    groups = [keys[g::GROUPS] for g in range(GROUPS)]
    sent: list[Event] = []
    for rnd in range(rounds):
        batches = []
        for group in groups:
            batch = [
                ctx.event(key, data={"round": rnd, "n": n}) for n in range(per_batch) for key in group
            ]  # interleaved: k0 m0, k1 m0, ..., k0 m1, ...
            batches.append(batch)
            sent += batch
        await asyncio.gather(*(_send_all(s, b) for b in batches))
    got = await s.expect(len(sent))
    by_id(sent, got)
    assert_order(sent, got)


@check
async def concurrent_senders(ctx: Context) -> None:
    """Eight tasks sending on one transport at once lose, duplicate and (per key) reorder nothing."""
    s = await ctx.session()
    tasks, per_task = 8, 12
    plans = [[ctx.event(f"sender-{t}", data={"t": t, "n": n}) for n in range(per_task)] for t in range(tasks)]

    async def sender(events: list[Event]) -> None:
        for e in events:
            await send_delivered(s, [e])

    await asyncio.gather(*(sender(p) for p in plans))
    sent = [e for p in plans for e in p]
    got = await s.expect(len(sent))
    by_id(sent, got)
    if s.caps.ordering_by_key:
        assert_order(sent, got)


@check
async def dedupe_same_id(ctx: Context) -> None:
    """With native_dedupe, sending the same event id twice is accepted both times and read back once."""
    s = await ctx.session()
    if not s.caps.native_dedupe:
        raise CheckSkipped("transport declares no native_dedupe")
    window = s.caps.dedupe_window
    if window is not None and window < 2:
        raise CheckSkipped(f"dedupe_window={window}s is too short to test reliably")
    first, sentinel = ctx.event("dup", data=b"once"), ctx.event("dup", data=b"after")
    await send_delivered(s, [first], what="first send()")
    await send_delivered(s, [first], what="second send() of the same id")
    await send_delivered(s, [sentinel], what="send() after the duplicate")
    ids = [r.event.id for r in await s.expect(2)]
    if ids.count(first.id) != 1 or sentinel.id not in ids:
        raise CheckFailed(
            f"expected the event once, then the next one; read {ids.count(first.id)} copies of it "
            f"before {'the next one' if sentinel.id in ids else 'anything else'}"
        )
    await s.expect_nothing_more()


@check
async def end_to_end_relay(ctx: Context) -> None:
    """Outbox (SQLite) -> Relay.run(drain=True) -> transport -> reader: a few hundred events over several
    streams all arrive, each once, in order per stream when ordering_by_key."""
    target = await ctx.new_target()
    transport = ctx.transport(target)
    caps = transport.capabilities
    if not caps.reader:
        raise CheckSkipped("transport declares no reader (capabilities.reader is false)")
    probe = ctx.event("probe")
    s = Session(ctx, transport, caps, transport.target(probe), await ctx.reader(transport, transport.target(probe)))
    ctx.ids.discard(probe.id)
    events = [ctx.event(f"e2e-{i % E2E_STREAMS}", data={"i": i}) for i in range(E2E_EVENTS)]
    db = Path(ctx.tmp_path) / f"{ctx.unique}.db"
    outbox = Outbox.open(f"sqlite:///{db}")
    try:
        await asyncio.to_thread(outbox.append, events)
        config = OutrelayConfig(relay=RelayConfig(poll_interval=0.05, drain_retry_bound=2.0, shutdown_grace=2.0))
        relay = Relay(outbox, config, transports={"conformance": transport})
        bound = ctx.read_timeout + 3 * ctx.timeout
        run = asyncio.ensure_future(relay.run(drain=True))
        if not (await asyncio.wait({run}, timeout=bound))[0]:
            relay.stop()  # graceful: settles what finished, so the summary says what happened
            await asyncio.wait({run}, timeout=2 * ctx.timeout + 2.0)
            if not run.done():
                run.cancel()
                raise CheckFailed(f"the relay did not stop within {2 * ctx.timeout + 2.0:g}s of stop()")
        summary = run.result()
    finally:
        outbox.close()
    counts = summary.counts["conformance"]
    if counts["delivered"] != E2E_EVENTS or summary.remaining:
        errors = [st.last_error for st in summary.status if st.last_error]
        raise CheckFailed(
            f"the relay delivered {counts['delivered']} of {E2E_EVENTS} events within {bound:g}s "
            f"({summary.remaining} pending, {counts['dead_lettered']} dead-lettered); "
            f"last error: {errors[0] if errors else 'none'}"
        )
    got = await s.expect(E2E_EVENTS)
    by_id(events, got)
    if caps.ordering_by_key:
        assert_order(events, got)
