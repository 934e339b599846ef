"""Ordering helpers: send a batch keeping ``ordered_batches`` honest, and report progress.

Three ways to send, from the safest to the fastest; each records every
outcome in the send's :class:`~outrelay.core.contract.progress.Progress` before the
send can be cut after it, and honours its deadline and stop (so a cut batch keeps what was
confirmed, and nothing is started that cannot finish):

* :func:`send_in_key_order` — one awaited ``publish(message)`` per message:
  keys concurrently, a key's messages one after another;
* :func:`send_chained` — one unconfirmed message per key, pipelined on one
  connection, no task per message;
* :func:`send_pipelined` — every message written at once on one ordered
  connection, outcomes awaited together.

After a key's first failure its later messages are not started
(:func:`not_sent`); a message not started for the deadline or a stop is
reported with :func:`deferred`. Both are :class:`~outrelay.core.contract.transport.NotSent`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from typing import Any

from outrelay.core.contract.progress import DEADLINE_MARGIN, Progress, current_progress
from outrelay.core.contract.transport import Delivered, Message, NotSent, Rejected, RetryLater, SendResult

__all__ = [
    "deferred",
    "failing_staged",
    "hold_after_failures",
    "not_sent",
    "send_chained",
    "send_in_key_order",
    "send_ordered",
    "send_pipelined",
]

Start = Callable[[Message], Awaitable["asyncio.Future[Any] | SendResult"]]
Outcome = Callable[[Message, "asyncio.Future[Any]"], SendResult]
Flush = Callable[[], Awaitable[None]]  # writes what ``start`` staged (see send_pipelined)


def not_sent(key: str) -> NotSent:
    """The result of a message held back, unsent, because an earlier one of its key failed."""
    return NotSent(f"not sent: an earlier event of stream {key!r} failed")


def deferred(progress: Progress) -> NotSent:
    """The result of a message not started because the relay is stopping or the deadline is near."""
    if progress.stopped:
        return NotSent("not sent: the relay is stopping; it is sent after the restart")
    return NotSent("not sent: the attempt's deadline (attempt_timeout) was too near; it goes with the next claim")


def _lanes(batch: Sequence[Message]) -> dict[str, list[int]]:
    lanes: dict[str, list[int]] = {}
    for i, m in enumerate(batch):
        lanes.setdefault(m.key, []).append(i)
    return lanes


def _filled(results: list[SendResult | None]) -> list[SendResult]:
    return [r if r is not None else RetryLater("no outcome recorded") for r in results]


async def send_in_key_order(
    batch: Sequence[Message], publish: Callable[[Message], Awaitable[SendResult]]
) -> list[SendResult]:
    """Send ``batch`` with ``publish(message)``: different keys concurrently,
    messages sharing a key one after another in batch order.

    Once a message of a key is not :class:`Delivered`, the later messages of
    that key are reported :func:`not_sent` without being sent. A later
    message of a key is started only if the key's previous message's latency
    still fits before the send's deadline (else :func:`deferred`). ``publish``
    must return a result rather than raise.
    """
    progress = current_progress()
    results: list[SendResult | None] = [None] * len(batch)
    loop = asyncio.get_running_loop()

    async def lane(indexes: list[int]) -> None:
        latency = 0.0
        for n, i in enumerate(indexes):
            if not progress.may_start(latency):
                for j in indexes[n:]:
                    results[j] = deferred(progress)
                return
            began = loop.time()
            results[i] = r = await publish(batch[i])
            latency = loop.time() - began
            progress.report(batch[i], r)
            if not isinstance(r, Delivered):
                for j in indexes[n + 1 :]:
                    results[j] = not_sent(batch[j].key)
                return

    lanes = list(_lanes(batch).values())
    if len(lanes) == 1:
        await lane(lanes[0])
    else:
        await asyncio.gather(*(lane(ix) for ix in lanes))
    return _filled(results)


def _cancel_pending(futures: Iterable[asyncio.Future[Any]]) -> None:
    for f in futures:
        if not f.done():
            f.cancel()


async def send_pipelined(
    batch: Sequence[Message],
    start: Start,
    outcome: Outcome,
    *,
    timeout: float | None,
    destination: str,
    log: logging.Logger,
    fix: str,
    flush: Callable[[], Awaitable[None]] | None = None,
) -> list[SendResult]:
    """Send ``batch`` pipelined on one ordered connection, keeping ``ordered_batches`` honest.

    ``start(m)`` writes ``m`` and returns a future of its broker outcome, or
    a result when it could not be written (then the later messages of its key
    are not started: :func:`not_sent`). Messages are started in batch order,
    one after another, never concurrently, and none once the relay is
    stopping. With ``flush``, ``start`` may only stage a message: ``flush()``
    is awaited once after the last start and must write what was staged, in
    order (if it raises, the staged futures must carry the failure; the
    exception itself is not raised here). The futures are then awaited
    together, at most ``timeout`` seconds, after which the rest are
    cancelled; ``outcome(m, future)`` maps each done or cancelled future to a
    result. :func:`hold_after_failures` then applies. The outcomes are
    recorded in the progress when the send returns; if it is cancelled
    instead, those that arrived are recorded, the other futures cancelled and
    CancelledError raised.
    """
    progress = current_progress()
    results: list[SendResult | None] = [None] * len(batch)
    started: dict[int, asyncio.Future[Any]] = {}
    try:
        await _start_in_order(batch, start, progress, results, started)
        if flush is not None:
            with contextlib.suppress(Exception):  # the staged futures carry the failure
                await flush()
        if started:
            _, late = await asyncio.wait(started.values(), timeout=timeout)
            _cancel_pending(list(late))
            if late:  # let cancelled tasks finish unwinding before their outcome is read
                await asyncio.wait(late)
    except BaseException:  # cut (cancelled) or a failing start: keep what the broker answered
        for i, future in started.items():
            if future.done() and not future.cancelled():
                results[i] = outcome(batch[i], future)
        progress.record(batch, results)
        _cancel_pending(started.values())
        raise
    for i, future in started.items():
        results[i] = outcome(batch[i], future)
    out = hold_after_failures(batch, _filled(results), destination=destination, log=log, fix=fix)
    progress.record(batch, out)
    return out


async def _start_in_order(
    batch: Sequence[Message],
    start: Start,
    progress: Progress,
    results: list[SendResult | None],
    started: dict[int, asyncio.Future[Any]],
) -> None:
    """:func:`send_pipelined`'s writes: in batch order, none after a local failure of its key."""
    halted: set[str] = set()
    for i, m in enumerate(batch):
        if m.key in halted:
            results[i] = not_sent(m.key)
            continue
        if progress.stopped:
            results[i] = deferred(progress)
            halted.add(m.key)
            continue
        begun = await start(m)
        if not isinstance(begun, asyncio.Future):  # a result: it was not written
            results[i] = begun
            halted.add(m.key)
            continue
        started[i] = begun


class _Chain:
    """The state of one :func:`send_chained` call (see there)."""

    def __init__(self, batch: Sequence[Message], outcome: Outcome, timeout: float | None) -> None:
        self.batch = batch
        self.outcome = outcome
        self.timeout = timeout
        self.progress = current_progress()
        self.loop = asyncio.get_running_loop()
        self.results: list[SendResult | None] = [None] * len(batch)
        #: (lane, position, its result, when its round began) of outcomes not yet acted on
        self.arrived: list[tuple[list[int], int, SendResult, float]] = []
        self.wake: asyncio.Future[None] | None = None  # the driver's, while it waits for an outcome
        #: one timer at a time, at the earliest deadline when it was set: it may ring early (that
        #: message's outcome came meanwhile), and then it is set again; never one per round
        self.timer: asyncio.TimerHandle | None = None
        self.deadlines: collections.deque[tuple[float, asyncio.Future[Any]]] = collections.deque()
        self.pending: set[asyncio.Future[Any]] = set()

    def rouse(self) -> None:
        if self.wake is not None and not self.wake.done():
            self.wake.set_result(None)

    def arrive(self, lane: list[int], n: int, began: float, future: asyncio.Future[Any]) -> None:
        self.pending.discard(future)
        i = lane[n]
        self.results[i] = r = self.outcome(self.batch[i], future)
        self.arrived.append((lane, n, r, began))
        self.rouse()

    def ring(self) -> None:
        self.timer = None
        self.rouse()

    def halt(self, lane: list[int], n: int, result: Callable[[Message], NotSent]) -> None:
        for j in lane[n:]:
            self.results[j] = result(self.batch[j])

    async def start_round(self, due: list[tuple[list[int], int]], start: Start) -> None:
        began = self.loop.time()  # one clock reading per round: its messages are written together
        for lane, n in due:
            i = lane[n]
            if self.progress.stopped:
                self.halt(lane, n, lambda _m: deferred(self.progress))
                continue
            begun = await start(self.batch[i])
            if not isinstance(begun, asyncio.Future):  # a result: it was not written
                self.results[i] = begun
                self.halt(lane, n + 1, lambda m: not_sent(m.key))
                continue
            self.pending.add(begun)
            begun.add_done_callback(functools.partial(self.arrive, lane, n, began))
            if self.timeout is not None:
                self.deadlines.append((began + self.timeout, begun))

    async def wait(self) -> None:
        """Until an outcome arrives, cancelling messages whose own timeout passed."""
        deadlines = self.deadlines
        while deadlines and deadlines[0][1].done():
            deadlines.popleft()
        if deadlines and self.timer is None:
            self.timer = self.loop.call_at(deadlines[0][0], self.ring)
        woken: asyncio.Future[None] = self.loop.create_future()
        self.wake = woken
        try:
            await woken
        finally:
            self.wake = None
        now = self.loop.time()
        while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
            _, late = deadlines.popleft()
            late.cancel()  # its outcome arrives (cancelled) like any other

    def next_round(self) -> list[tuple[list[int], int]]:
        """Act on the arrived outcomes: each confirmed key's next message, if its predecessor's
        latency still fits before the deadline (``Progress.may_start``, read inline: once per round)."""
        due: list[tuple[list[int], int]] = []
        now = self.loop.time()
        deadline = self.progress.deadline
        for lane, n, r, began in self.arrived:
            if not isinstance(r, Delivered):
                self.halt(lane, n + 1, lambda m: not_sent(m.key))
            elif n + 1 < len(lane):
                if deadline is None or now + (now - began) * DEADLINE_MARGIN < deadline:
                    due.append((lane, n + 1))
                else:
                    self.progress.declined = True
                    self.halt(lane, n + 1, lambda _m: deferred(self.progress))
        self.arrived.clear()
        return due


async def send_chained(
    batch: Sequence[Message],
    start: Start,
    outcome: Outcome,
    *,
    timeout: float | None,
    destination: str,
    log: logging.Logger,
    flush: Callable[[], Awaitable[None]] | None = None,
) -> list[SendResult]:
    """Send ``batch`` with one unconfirmed message per key, keys in parallel, pipelined.

    The same order guarantee as :func:`send_in_key_order` — a key's next
    message is written only once the previous one is :class:`Delivered` (and
    only if that one's latency still fits before the send's deadline), and
    after a failure the key's later messages are reported :func:`not_sent` —
    at close to the cost of :func:`send_pipelined`: no task or coroutine per
    message or key. The first message of every key is written at once
    (``start`` as for :func:`send_pipelined`); then, each time outcomes
    arrive, the next message of each key just confirmed is written. With
    ``flush`` (as there), ``start`` may only stage and ``flush()`` writes what
    was staged, once per round of starts. Each outcome is awaited at most
    ``timeout`` seconds after its message was started; then its future is
    cancelled and ``outcome`` maps it. The outcomes that arrived are recorded
    in the progress when the send returns or is cancelled. ``destination`` and ``log`` are accepted for
    symmetry with :func:`send_pipelined` (one message per key in flight cannot
    break order). If the send is cancelled, the futures in flight are
    cancelled and CancelledError raised.
    """
    del destination, log
    chain = _Chain(batch, outcome, timeout)
    due = [(lane, 0) for lane in _lanes(batch).values()]
    try:
        while True:
            await chain.start_round(due, start)
            if due and flush is not None:
                with contextlib.suppress(Exception):  # the staged futures carry the failure
                    await flush()
            if not chain.pending and not chain.arrived:
                break
            if not chain.arrived:
                await chain.wait()
            due = chain.next_round()
    except BaseException:  # cut (cancelled) or a failing start: keep what the broker answered
        _cancel_pending(list(chain.pending))
        raise
    finally:
        if chain.timer is not None:
            chain.timer.cancel()
        chain.progress.record(batch, chain.results)
    return _filled(chain.results)


async def send_ordered(
    batch: Sequence[Message],
    start: Start,
    outcome: Outcome,
    *,
    pipeline: bool,
    timeout: float | None,
    destination: str,
    log: logging.Logger,
    flush: Flush | None = None,
) -> list[SendResult]:
    """:func:`send_pipelined` when ``pipeline`` is set, else :func:`send_chained`, with the same arguments.

    For a transport with a ``pipeline`` option: pipelined, the whole batch is
    written in order on one ordered connection and the outcomes awaited
    together (a failure is reported with the fix "set pipeline = false");
    chained, one message per key is in flight at a time, so a later one never
    overtakes a lost or refused one. Failure modes, progress and cancellation:
    those of the helper chosen.
    """
    if pipeline:
        return await send_pipelined(
            batch, start, outcome, timeout=timeout, destination=destination, log=log,
            fix="set pipeline = false", flush=flush,
        )  # fmt: skip
    return await send_chained(batch, start, outcome, timeout=timeout, destination=destination, log=log, flush=flush)


@contextlib.contextmanager
def failing_staged(futures: Sequence[asyncio.Future[Any]]) -> Iterator[None]:
    """Around a ``flush`` that writes staged messages (see :func:`send_pipelined`): if the
    write is cancelled, the staged ``futures`` are cancelled; if it raises, those not
    done yet get the exception. Either way the exception propagates."""
    try:
        yield
    except asyncio.CancelledError:
        for future in futures:
            future.cancel()
        raise
    except BaseException as exc:
        for future in futures:
            if not future.done():
                future.set_exception(exc)
        raise


def hold_after_failures(
    batch: Sequence[Message], results: list[SendResult], *, destination: str, log: logging.Logger, fix: str
) -> list[SendResult]:
    """The ``ordered_batches`` rule for a batch whose messages were all in flight at once.

    A transport that pipelines a stream's messages on one ordered connection
    learns their outcomes together. After a stream's first failure, its later
    failures are reported held (RetryLater). A later message the broker
    *stored* stays :class:`Delivered` — re-sending it would only duplicate
    it — and the possible break in the stream's order is logged as a warning
    naming both events, the failure and ``fix`` (how to get strict order).
    (After a timeout the earlier event may in fact have been stored first.)
    Returns ``results``, changed in place.
    """
    failed: dict[str, tuple[Message, str]] = {}
    for i, (m, r) in enumerate(zip(batch, results, strict=True)):
        first = failed.get(m.key)
        if first is None:
            if isinstance(r, RetryLater):
                failed[m.key] = (m, r.error)
            elif isinstance(r, Rejected):
                failed[m.key] = (m, r.reason)
        elif not isinstance(r, Delivered):
            if not isinstance(r, NotSent):
                results[i] = RetryLater(f"held back: an earlier event of stream {m.key!r} failed")
        elif not r.duplicate:
            log.warning(
                "destination %s: stream %r may be out of order: event %s was stored while the earlier event %s "
                "failed (%s) and will be retried; %s for strict order",
                destination,
                m.key,
                m.event.id,
                first[0].event.id,
                first[1],
                fix,
            )
    return results
