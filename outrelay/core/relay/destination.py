"""One destination's delivery loop inside the relay.

Claims due lanes, sends batches through the transport with at most
``max_in_flight`` batches outstanding, and settles every message: delivered,
retry at T (backoff with jitter, Retry-After honoured), dead-letter or park
on exhaustion/rejection. A whole batch failing retryably pauses the
destination until its earliest retry instead of hammering a broker that is
down; with ``[destinations.NAME.breaker]`` a :class:`~outrelay.core.relay.breaker.Breaker`
also stops its traffic after repeated failures and probes it (one event per
interval) until it answers again.

An outage is logged twice, not once per retry: the first failure after
success (a batch with nothing delivered, or a failed open) is one WARNING
naming the destination and the error; the first delivery after it is one
INFO. Retries in between log at DEBUG.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from outrelay.core.config.config import DestinationConfig, OutrelayConfig
from outrelay.core.contract.progress import Progress, sending
from outrelay.core.contract.segments import RejectedTarget
from outrelay.core.contract.transport import Delivered, Message, NotSent, Rejected, RetryLater, SendResult, Transport
from outrelay.core.model.errors import PermanentError, RetryableError, StoreError, UsageError
from outrelay.core.relay.attempts import AttemptLog
from outrelay.core.relay.breaker import Breaker, save_state
from outrelay.core.relay.budget import ByteBudget
from outrelay.core.relay.handoff import RoutingHandoff
from outrelay.core.relay.retry import backoff_delay
from outrelay.core.relay.routing import Router
from outrelay.core.stores.base import Attempt, Claimed, SettleKind, Settlement, Store

__all__ = ["DestinationWorker", "WorkerHost"]

log = logging.getLogger("outrelay.relay")
T = TypeVar("T")


class WorkerHost(Protocol):
    """What a :class:`DestinationWorker` needs of the relay that runs it (the
    :class:`~outrelay.core.relay.relay.Relay` is one): the store and a way to call it off the
    loop, the configuration, the relay's identity as lease owner, the plugin hooks, the
    byte budget shared by all destinations, the router (which events park), the attempt
    log, the routing hand-off, and the relay's stop flag."""

    config: OutrelayConfig
    store: Store
    owner: str
    hook: Any  # pluggy's hook relay: outrelay_send_transform, _batch_settled, _breaker_changed
    budget: ByteBudget
    router: Router
    attempt_log: AttemptLog | None
    #: the store's route-then-claim in one transaction, or None (the router routes new appends)
    route_and_claim: Callable[..., tuple[int, list[Claimed]]] | None
    handoff: RoutingHandoff
    stopping: bool

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a store call off the event loop."""
        ...

    def wake(self, pending_commit: bool = False) -> None:
        """New appends may be waiting: route them."""
        ...

    def routed(self, count: int, started: float, *, by: DestinationWorker | None = None) -> None:
        """``count`` events were routed by a destination's claim (``by``; report them, wake the others)."""
        ...


@dataclass
class _Attempted:
    """One attempt of a batch: the messages sent, their results, whether ``attempt_timeout``
    expired, and when (wall clock) and how long (seconds) the send ran."""

    messages: list[Message]
    results: Sequence[SendResult]
    timed_out: bool
    sent_at: float
    elapsed: float


class DestinationWorker:
    """Delivery loop of one destination (see module docstring)."""

    def __init__(self, relay: WorkerHost, name: str, transport: Transport, config: DestinationConfig) -> None:
        self.relay = relay
        self.name = name
        self.transport = transport
        self.config = config
        caps = transport.capabilities
        self.batch_size = min(config.batch_size, caps.max_batch_count)
        #: events of one stream per batch: the configured per_stream, halved after an attempt that
        #: ran out of attempt_timeout and grown back by one per batch delivered in time (a transport
        #: sends a stream's events one after another, so a lane slower than the deadline would
        #: otherwise be re-sent whole, forever)
        self.max_per_lane = config.per_stream if caps.ordered_batches else 1
        self.per_lane = self.max_per_lane
        self.wake = asyncio.Event()
        #: waiting for work (a claim found nothing): the relay wakes it to route new appends
        self.idle = False
        self._idle_until = 0.0  # when that wait ends by itself (time.time())
        self.inflight: set[asyncio.Task[None]] = set()
        #: the progress of every send in flight (:meth:`stop_sending` tells them to start nothing new)
        self.sending: set[Progress] = set()
        self.slots = asyncio.Semaphore(config.max_in_flight)
        self.opened = False
        self.failing_since: float | None = None
        self.blocked_until = 0.0
        self.disabled: str | None = None
        self._disable_version = 0  # bumped when a batch disables the destination (beats a stale read)
        self.counts = {"delivered": 0, "duplicates": 0, "retried": 0, "dead_lettered": 0, "parked": 0, "batches": 0}
        self.last_error: str | None = None
        self._outage: str | None = None  # the error of the outage in progress (logged once)
        self._outage_since = 0.0
        #: per-batch transforms plugins gave for this destination (payload encryption, claim-check); usually none
        self.transforms = relay.hook.outrelay_send_transform(config=relay.config, destination=name, transport=transport)
        #: the circuit breaker (``[destinations.NAME.breaker]``), or None
        self.breaker = None if config.breaker is None else Breaker(config.breaker, name, self._breaker_changed)

    # -- outage log --------------------------------------------------------------

    def _failing(self, error: str) -> None:
        """Log the first failure after success as one WARNING; later ones at DEBUG."""
        fields = {"destination": self.name, "error": error}
        if self._outage is None:
            self._outage_since = time.monotonic()
            log.warning(
                "destination %s failing: %s (retrying with backoff; logged again on recovery)",
                self.name,
                error,
                extra=fields,
            )
        else:
            log.debug("destination %s still failing: %s", self.name, error, extra=fields)
        self._outage = error

    def outage_seconds(self) -> float | None:
        """How long deliveries (or opening) have been failing without a success; None when healthy."""
        return None if self._outage is None else time.monotonic() - self._outage_since

    def _breaker_changed(self, destination: str, state: str, reason: str) -> None:
        self.relay.hook.outrelay_breaker_changed(destination=destination, state=state, reason=reason)

    async def _save_breaker(self, breaker: Breaker) -> None:
        """Write the breaker's state next to the outbox for ``outrelay status`` (best effort)."""
        breaker.dirty = False
        url = getattr(self.relay.store, "url", None)
        if not isinstance(url, str):
            return
        try:
            await self.relay.db(save_state, url, self.name, self.relay.owner, breaker.snapshot(), time.time())
        except (StoreError, OSError) as exc:  # status then shows an older state; delivery goes on
            log.debug("destination %s: could not record the circuit breaker's state (%s)", self.name, exc)

    def _recovered(self) -> None:
        if self._outage is not None:
            log.info(
                "destination %s recovered after %.1fs (last error: %s)",
                self.name,
                time.monotonic() - self._outage_since,
                self._outage,
                extra={"destination": self.name, "error": self._outage},
            )
            self._outage = None

    # -- lifecycle -------------------------------------------------------------

    async def run(self) -> None:
        await self._open()
        relay = self.relay
        checked = 0.0
        store_delay = 0.5
        while not relay.stopping:
            try:
                if time.monotonic() - checked >= relay.config.relay.poll_interval:
                    version = self._disable_version
                    fresh = await relay.db(relay.store.disabled, self.name)
                    if version == self._disable_version:  # a batch did not disable us meanwhile
                        self.disabled = fresh
                    checked = time.monotonic()
                await self._step()
                store_delay = 0.5
            except StoreError as exc:  # database down or locked: wait and try again, nothing is lost
                self.last_error = str(exc)
                store_delay = await self._store_retry("outbox unavailable", exc, store_delay, self._sleep, 30.0)

    async def _step(self) -> None:
        """One pass of the claim loop: wait if paused, else claim a batch and start sending it."""
        relay = self.relay
        if await self._paused():
            return
        await self.slots.acquire()
        room = 0 if relay.stopping else await relay.budget.room()
        if room <= 0:  # stopping
            self.slots.release()
            return
        # asked after the waits above: a batch that ended meanwhile may have opened the breaker
        breaker = self.breaker
        probe = breaker is not None and breaker.open
        if probe:  # open: nothing but one event per probe interval
            assert breaker is not None
            wait = breaker.probe_wait(time.time())
            if wait > 0:
                self.slots.release()
                await self._sleep(wait)
                return
        claim_started = time.time()
        try:
            claimed = await self._claim(probe, room, claim_started)
        except BaseException:
            self.slots.release()
            raise
        if not claimed:
            self.slots.release()
            await self._wait_for_work()
            return
        if not probe and breaker is not None and breaker.open:  # it opened during the claim: send none of it
            self.slots.release()
            await self._settle([Settlement(c.delivery_id, c.event.stream, "hold") for c in claimed], time.time())
            return
        size = sum(len(c.event.data) for c in claimed)
        relay.budget.take(size)
        if probe:
            assert breaker is not None
            breaker.start_probe(time.time())
        task = asyncio.create_task(self._process(claimed, size, (claim_started, time.time()), probe))
        self.inflight.add(task)
        task.add_done_callback(self.inflight.discard)

    async def _paused(self) -> bool:
        """Wait instead of claiming when the destination is disabled, blocked (backing off after
        a batch that failed whole) or has nothing due yet; True when it waited."""
        relay = self.relay
        poll = relay.config.relay.poll_interval
        if self.disabled is not None or not self.config.enabled:
            await self._sleep(poll)
            return True
        now = time.time()
        if now < self.blocked_until:
            await self._sleep(self.blocked_until - now)
            return True
        if not relay.handoff.waits:  # the store may know, without a query, that nothing is due yet
            quiet = relay.store.quiet_until(self.name, poll)
            if quiet > now:
                await self._wait_for_work(quiet)
                return True
            return False
        hold = relay.handoff.hold()  # steady load: let a few milliseconds of appends share one routing
        if hold > 0:
            self.wake.clear()  # the claim after the hold sees whatever woke us meanwhile
            await asyncio.sleep(hold)
            return True
        return False

    async def _claim(self, probe: bool, room: int, now: float) -> list[Claimed]:
        """Claim a batch (one event when ``probe``) within ``room`` bytes; where the store routes
        and claims in one transaction and appends are waiting, route them first (the hand-off)."""
        relay = self.relay
        claim: dict[str, Any] = {
            "limit": 1 if probe else self.batch_size, "per_lane": 1 if probe else self.per_lane, "owner": relay.owner,
            "lease_seconds": relay.config.relay.lease_seconds, "now": now, "max_bytes": room,
        }  # fmt: skip
        combined = relay.route_and_claim
        if combined is None or not relay.handoff.take():
            return await relay.db(relay.store.claim, self.name, **claim)
        routed = 0
        claimed: list[Claimed] = []  # what a failed call leaves: no backlog seen
        try:
            routed, claimed = await relay.db(combined, relay.router, relay.config.relay.route_batch, self.name, **claim)
        except BaseException:
            relay.wake()  # routed nothing: the appends wait for the next routing again
            raise
        finally:
            relay.handoff.done(backlog=routed >= relay.config.relay.route_batch or len(claimed) >= claim["limit"])
        relay.routed(routed, now, by=self)  # it claimed after routing: it needs no wake-up for them
        return claimed

    async def _open(self) -> None:
        delay = 0.2
        while not self.relay.stopping:
            try:
                await self.transport.open()
                self.opened = True
                self.blocked_until = 0.0
                self.failing_since = None
                self._recovered()
                # `outrelay status` shows a destination whose open failed as failing until it opens
                await self.relay.db(self.relay.store.record_error, self.name, None, time.time())
                return
            except Exception as exc:  # the broker may be down: keep trying
                msg = _describe(exc)
                if self.failing_since is None:
                    self.failing_since = time.time()
                self.last_error = f"open failed: {msg}"
                self._failing(f"cannot open transport: {msg}")
                await self.relay.db(self.relay.store.record_error, self.name, self.last_error, time.time())
                self.blocked_until = time.time() + delay
                await self._sleep(delay)
                delay = min(delay * 2, 30.0)

    async def _sleep(self, seconds: float) -> None:
        """Sleep until woken (new work, a settled batch, stop) or ``seconds`` pass.

        A wake that arrived before the sleep ends it at once: it is cleared
        only after waiting, so no wake-up is lost.
        """
        if self.relay.stopping:
            return
        if not self.wake.is_set():  # a timeout scope, not wait_for's task per sleep
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, seconds)):
                    await self.wake.wait()
        self.wake.clear()

    async def _wait_for_work(self, quiet: float = 0.0) -> None:
        """Sleep until woken or the next lane is due (``quiet``, else the store's
        :meth:`~outrelay.core.stores.base.Store.quiet_until` or its ``next_due``),
        at most a poll interval."""
        poll = self.relay.config.relay.poll_interval
        next_due: float | None = quiet or self.relay.store.quiet_until(self.name, poll)
        if not next_due:
            next_due = await self.relay.db(self.relay.store.next_due, self.name)
        timeout = poll if next_due is None else min(poll, max(0.001, next_due - time.time()))
        if self.relay.handoff.waits:  # appends came in meanwhile: the next claim routes them
            return
        self.idle = True
        self._idle_until = time.time() + timeout
        try:
            await self._sleep(timeout)
        finally:
            self.idle = False

    async def drain_inflight(self, grace: float, bound: float) -> None:
        """Wait up to ``grace`` seconds for in-flight batches, then cancel them
        and wait at most ``bound`` more (a send that ignores cancellation is
        abandoned). Their lanes stay leased and are released with the relay:
        the events stay pending, nothing is lost."""
        if self.inflight:
            _, pending = await asyncio.wait(set(self.inflight), timeout=grace)
            for task in pending:
                task.cancel()
            if pending:
                _, stuck = await asyncio.wait(pending, timeout=bound)
                if stuck:
                    log.warning(
                        "destination %s: %d batch(es) ignored cancellation; abandoned",
                        self.name,
                        len(stuck),
                        extra={"destination": self.name},
                    )

    def stop_sending(self) -> None:
        """The relay is stopping: sends in flight start no further message (what is
        already on its way finishes, and is settled, within ``shutdown_grace``)."""
        for progress in self.sending:
            progress.stop()

    def idle_until(self, now: float, next_due: float | None) -> float:
        """When this destination will next have something to do (inf: never)."""
        if self.inflight:
            return now
        if self.disabled is not None or not self.config.enabled:
            return float("inf")
        if next_due is None or (self.breaker is not None and self.breaker.open):  # open: down, not busy
            return float("inf")
        return max(next_due, self.blocked_until)

    # -- one batch ---------------------------------------------------------------

    async def _process(
        self,
        claimed: Sequence[Claimed],
        size: int = 0,
        claim_times: tuple[float, float] = (0.0, 0.0),
        probe: bool = False,
    ) -> None:
        """Send one claimed batch and settle every message of it: attempt, settle (with the
        attempt log's rows), then the destination's health and reports. Cut at shutdown,
        what the broker confirmed is settled as delivered; a batch that cannot be settled
        stays leased (sent again after the relay stops). Always frees its slot and bytes."""
        settled = False
        messages: list[Message] = []
        progress = Progress(asyncio.get_running_loop().time() + self.config.attempt_timeout)
        try:
            messages = [
                Message(c.event, self.transport.target(c.event), c.event.stream, c.attempts + 1) for c in claimed
            ]
            failed: list[SendResult] | None = None
            if self.transforms:  # what a cut at shutdown settles is known by the transformed messages
                messages, failed = await self._transform(messages, progress)
            sent = await self._attempt(messages, failed, progress)
            now = time.time()
            settlements, disable = await self._conclude(claimed, sent, now, probe)
            settled = True
            await self._health(sent, settlements, progress, now)
            if disable is not None:
                await self._disable(disable, now)
            if self.breaker is not None and self.breaker.dirty:
                await self._save_breaker(self.breaker)
            self._report(sent, claim_times)
        except asyncio.CancelledError:
            if not settled:  # cut at shutdown: what the broker confirmed is not sent again after the restart
                await self._settle_confirmed(claimed, messages, progress)
            raise
        except Exception as exc:  # the relay is stopping with the outbox unavailable, or a bug
            # Nothing is lost: the batch's lanes stay leased by this relay and are released when it stops.
            if settled:
                return
            self.last_error = f"could not settle a batch: {exc}"
            log.error(
                "destination %s: could not settle a batch of %d (%s); it is sent again after the relay stops",
                self.name,
                len(claimed),
                exc,
                extra={"destination": self.name, "error": str(exc)},
            )
        finally:
            if probe and self.breaker is not None:
                self.breaker.probe_ended()
            self.relay.budget.free(size)
            self.slots.release()
            if not (settled and self._nothing_new()):
                self.wake.set()

    def _nothing_new(self) -> bool:
        """After a settled batch: whether the worker may sleep on, unwoken. True when it waits for work
        and the store knows nothing of this destination is due before that wait ends anyway (the batch
        emptied its lanes: a relay at a trickle, where waking it cost a loop round per batch to find
        nothing); never with a breaker (a probe's end must claim at once). A settle that keeps a lane
        pending lowers what the store knows (:meth:`~outrelay.core.stores.base.Store.quiet_until`), and
        a store that knows nothing answers 0.0: the worker is woken as before."""
        if not self.idle or self.breaker is not None:
            return False
        # at any age: the wait's end was set from what the store knew then (trusted for a poll interval)
        return self.relay.store.quiet_until(self.name, math.inf) >= self._idle_until

    async def _attempt(
        self, messages: list[Message], failed: list[SendResult] | None, progress: Progress
    ) -> _Attempted:
        """One send under ``attempt_timeout`` (every failure as per-message results), unless the
        transforms ``failed`` the batch already."""
        started, sent_at = time.monotonic(), time.time()
        self.sending.add(progress)
        try:
            results, timed_out = (failed, False) if failed is not None else await self._send(messages, progress)
        finally:
            self.sending.discard(progress)
        return _Attempted(messages, results, timed_out, sent_at, time.monotonic() - started)

    async def _conclude(
        self, claimed: Sequence[Claimed], sent: _Attempted, now: float, probe: bool
    ) -> tuple[list[Settlement], str | None]:
        """Plan each message's settlement (the breaker counts the outcomes; a probe's failure
        settles as held, not an attempt) and settle them with the attempt log's rows. Returns
        the settlements and the reason to disable the destination, if a result asked for it
        (claiming stops before the settle releases the lanes)."""
        results = sent.results
        planned = results if self.breaker is None else self.breaker.outcomes(results, probe=probe, now=now)
        settlements, disable = self._plan(claimed, planned, now)
        attempt_log = self.relay.attempt_log
        logged = (
            None
            if attempt_log is None
            else attempt_log.mark(self.name, claimed, results, settlements, sent.sent_at, sent.elapsed)
        )
        if disable is not None:
            self.disabled = disable
            self._disable_version += 1
        await self._settle(settlements, now, logged)
        return settlements, disable

    async def _health(self, sent: _Attempted, settlements: list[Settlement], progress: Progress, now: float) -> None:
        """After a settled batch: adapt the per-stream batch size, log an outage's start or end,
        record the error for ``status``, and pause the destination when the whole batch failed
        retryably (until its earliest retry). A message not attempted (NotSent) is no failure:
        it waits for the next claim as it was."""
        results = sent.results
        failures = [r for r in results if not isinstance(r, Delivered | NotSent)]
        self._adapt_lane(sent.timed_out or progress.declined, failures)
        if len(failures) < len(results) and any(isinstance(r, Delivered) for r in results):
            self._recovered()
        elif any(isinstance(r, RetryLater) for r in failures):
            self._failing(next(r for r in failures if isinstance(r, RetryLater)).error)
        if not failures:
            return
        first = failures[0]
        self.last_error = first.error if isinstance(first, RetryLater) else getattr(first, "reason", "")
        await self.relay.db(self.relay.store.record_error, self.name, self.last_error, now)
        # a timed-out batch may hold one stuck stream among healthy ones: back off per lane
        # (the settlements), without pausing the whole destination
        if not sent.timed_out and len(failures) == len(results) and all(isinstance(r, RetryLater) for r in failures):
            retries = [s.due_at for s in settlements if s.kind == "retry"]
            self.blocked_until = max(self.blocked_until, min(retries) if retries else now)

    async def _disable(self, reason: str, now: float) -> None:
        """A result asked to disable the destination: log it and record it in the outbox."""
        log.error(
            "destination %s disabled: %s; re-enable with `outrelay enable %s`",
            self.name,
            reason,
            self.name,
            extra={"destination": self.name, "error": reason},
        )
        await self.relay.db(self.relay.store.set_disabled, self.name, reason, now)

    def _report(self, sent: _Attempted, claim_times: tuple[float, float]) -> None:
        """Count the batch, call ``outrelay_batch_settled`` and log each message at DEBUG."""
        self.counts["batches"] += 1
        self.relay.hook.outrelay_batch_settled(
            destination=self.name,
            messages=sent.messages,
            results=sent.results,
            elapsed=sent.elapsed,
            timeline=(*claim_times, sent.sent_at, sent.sent_at + sent.elapsed, time.time()),
        )
        if not log.isEnabledFor(logging.DEBUG):
            return
        for m, r in zip(sent.messages, sent.results, strict=True):
            log.debug(
                "published %s",
                type(r).__name__,
                extra={
                    "event_id": m.event.id,
                    "stream": m.event.stream,
                    "tenant": m.event.tenant,
                    "event_type": m.event.type,
                    "producer": m.event.source,
                    "destination": self.name,
                },
            )

    async def _transform(
        self, messages: list[Message], progress: Progress
    ) -> tuple[list[Message], list[SendResult] | None]:
        """Apply the plugins' transforms. An ``async`` one may do I/O (the claim-check stores
        payloads): they run within the attempt's deadline, and when one raises RetryableError
        or PermanentError, or the deadline expires, every message of the batch takes that
        failure (the second value), as when ``transport.send`` raises."""
        failure: SendResult
        try:
            async with asyncio.timeout_at(progress.deadline):
                for transform in self.transforms:
                    out = transform(messages)
                    messages = await out if inspect.isawaitable(out) else out
            return messages, None
        except TimeoutError:
            failure = RetryLater(
                f"preparing a batch for destination {self.name!r} took longer than attempt_timeout "
                f"({self.config.attempt_timeout:g}s); it is retried"
            )
        except RetryableError as exc:
            failure = RetryLater(str(exc), exc.retry_after)
        except PermanentError as exc:
            failure = Rejected(str(exc))
        return messages, [failure] * len(messages)

    async def _settle_confirmed(self, claimed: Sequence[Claimed], messages: list[Message], progress: Progress) -> None:
        """Settle as delivered what ``progress`` says the broker confirmed, once, without retrying
        (the relay is stopping; the other events of the batch stay pending)."""
        if len(messages) != len(claimed):
            return
        done = [
            Settlement(c.delivery_id, c.event.stream, "delivered")
            for c, m in zip(claimed, messages, strict=True)
            if isinstance(progress.outcome(m), Delivered)
        ]
        if not done:
            return
        try:
            await self.relay.db(self.relay.store.settle, self.name, self.relay.owner, done, time.time())
        except Exception as exc:  # they stay pending: at least once holds, they may be sent again
            log.warning(
                "destination %s: could not settle %d confirmed event(s) at shutdown (%s)", self.name, len(done), exc
            )
        else:
            self.counts["delivered"] += len(done)

    def _adapt_lane(self, timed_out: bool, failures: Sequence[SendResult]) -> None:
        if timed_out and self.per_lane > 1:
            self.per_lane = max(1, self.per_lane // 2)
            log.info(
                "destination %s: an attempt ran out of attempt_timeout; %d event(s) per stream per batch now",
                self.name,
                self.per_lane,
                extra={"destination": self.name},
            )
        elif not timed_out and not failures and self.per_lane < self.max_per_lane:
            self.per_lane += 1

    async def _settle(self, settlements: list[Settlement], now: float, logged: list[Attempt] | None = None) -> None:
        """Settle, retrying while the outbox is unavailable: this relay keeps the
        lanes leased meanwhile (renewed), so no other claim sends them again.
        ``logged``: the delivery-attempt log's rows, written in the settle's transaction."""
        delay = 0.2
        extra = {"attempts": logged} if logged else {}  # only a store that keeps the log is given any
        while True:
            try:
                await self.relay.db(self.relay.store.settle, self.name, self.relay.owner, settlements, now, **extra)
                return
            except StoreError as exc:
                if self.relay.stopping:
                    raise
                delay = await self._store_retry("cannot settle a batch", exc, delay, asyncio.sleep, 10.0)

    async def _store_retry(
        self, what: str, exc: StoreError, delay: float, sleep: Callable[[float], Awaitable[None]], cap: float
    ) -> float:
        """After the outbox failed with ``exc``: log ``destination <name>: <what> (<exc>); retrying in
        <delay>s``, wait ``delay`` seconds with ``sleep``, and return the next delay (twice this one,
        at most ``cap``)."""
        log.warning(
            "destination %s: %s (%s); retrying in %.1fs",
            self.name,
            what,
            exc,
            delay,
            extra={"destination": self.name, "error": str(exc)},
        )
        await sleep(delay)
        return min(delay * 2, cap)

    async def _send(self, messages: list[Message], progress: Progress) -> tuple[Sequence[SendResult], bool]:
        """Send one batch under ``attempt_timeout`` (``progress.deadline``); every failure becomes
        per-message results. The flag is True when the deadline expired.

        A send that does not return — deadline, a whole-batch error, a transport bug — keeps
        the outcomes reported to ``progress`` (what the broker confirmed settles as delivered);
        only the others take the failure.
        """
        tenants = self.config.tenants  # a last line: operator replays do not pass the router
        if any(isinstance(m.target, RejectedTarget) for m in messages) or (
            tenants and any(m.event.tenant not in tenants for m in messages)
        ):
            return await self._send_valid(messages, progress)
        n = len(messages)
        deadline = asyncio.timeout_at(progress.deadline)
        failure: SendResult
        try:
            with sending(progress):
                async with deadline:
                    results = await self.transport.send(messages)
        except TimeoutError:
            if not deadline.expired():  # the transport's own TimeoutError escaped: a transport bug
                log.exception(
                    "destination %s: transport raised TimeoutError (a transport bug)",
                    self.name,
                    extra={"destination": self.name},
                )
                failure = RetryLater(f"unexpected TimeoutError from transport {self.transport.name!r}")
                return progress.cut(messages, failure), False
            failure = RetryLater(
                f"delivery attempt to destination {self.name!r} timed out after {self.config.attempt_timeout:g}s "
                f"(attempt_timeout); it is retried — raise attempt_timeout if the {self.transport.name} "
                "endpoint is just slow"
            )
            return progress.cut(messages, failure), True
        except RetryableError as exc:
            return progress.cut(messages, RetryLater(str(exc), exc.retry_after)), False
        except PermanentError as exc:
            return progress.cut(messages, Rejected(str(exc))), False
        except UsageError as exc:
            return progress.cut(messages, RetryLater(f"transport not usable: {exc}")), False
        except Exception as exc:  # a transport bug must not lose events
            log.exception(
                "destination %s: transport raised %s (a transport bug)",
                self.name,
                type(exc).__name__,
                extra={"destination": self.name},
            )
            failure = RetryLater(f"unexpected {type(exc).__name__} from transport {self.transport.name!r}")
            return progress.cut(messages, failure), False
        if len(results) != n:
            log.error(
                "destination %s: transport returned %d results for %d messages",
                self.name,
                len(results),
                n,
                extra={"destination": self.name},
            )
            return progress.cut(messages, RetryLater("transport returned a wrong number of results")), False
        return results, False

    async def _send_valid(self, messages: list[Message], progress: Progress) -> tuple[Sequence[SendResult], bool]:
        """Reject messages whose target could not be rendered safely, or whose tenant this
        destination does not serve (``tenants``); send the others."""
        early: dict[int, SendResult] = {}
        tenants = self.config.tenants
        for i, m in enumerate(messages):
            if isinstance(m.target, RejectedTarget):
                early[i] = Rejected(m.target.reason)
            elif tenants and m.event.tenant not in tenants:
                early[i] = Rejected(
                    f"tenant {m.event.tenant!r} is not served by destination {self.name!r} "
                    f"(tenants = {list(tenants)}); event not sent"
                )
        rest = [m for i, m in enumerate(messages) if i not in early]
        results, timed_out = await self._send(rest, progress) if rest else ([], False)
        sent = iter(results)
        return [early[i] if i in early else next(sent) for i in range(len(messages))], timed_out

    def _plan(
        self, claimed: Sequence[Claimed], results: Sequence[SendResult], now: float
    ) -> tuple[list[Settlement], str | None]:
        delivered = [r for r in results if type(r) is Delivered]
        if len(delivered) == len(results):  # the common case, without the per-result branches
            self.counts["delivered"] += len(delivered)
            self.counts["duplicates"] += sum(1 for r in delivered if r.duplicate)
            return [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed], None
        policy = self.config.retry
        failed: set[str] = set()
        out: list[Settlement] = []
        disable: str | None = None
        for c, r in zip(claimed, results, strict=True):
            stream = c.event.stream
            if isinstance(r, Delivered):
                out.append(Settlement(c.delivery_id, stream, "delivered"))
                self.counts["delivered"] += 1
                self.counts["duplicates"] += int(r.duplicate)
                continue
            if stream in failed or isinstance(r, NotSent):  # not attempted: pending as it was
                out.append(Settlement(c.delivery_id, stream, "hold"))
                failed.add(stream)
                continue
            failed.add(stream)
            attempts = c.attempts + 1
            if isinstance(r, Rejected) and r.disable_destination:
                disable = r.reason
                out.append(Settlement(c.delivery_id, stream, "hold"))
                continue
            if isinstance(r, RetryLater) and attempts < policy.max_attempts:
                due = now + backoff_delay(policy, attempts, r.retry_after)
                out.append(Settlement(c.delivery_id, stream, "retry", attempts, due, r.error))
                self.counts["retried"] += 1
                continue
            if isinstance(r, RetryLater):
                reason = f"retries exhausted after {attempts} attempts: {r.error}"
            else:
                reason = f"rejected: {r.reason}" if isinstance(r, Rejected) else repr(r)
            kind: SettleKind = "park" if self.relay.router.parks(c.event, self.name) else "dead"
            self.counts["parked" if kind == "park" else "dead_lettered"] += 1
            log.warning(
                "destination %s: event %s (stream %s) %s: %s",
                self.name,
                c.event.id,
                stream,
                "parked" if kind == "park" else "dead-lettered",
                reason,
                extra={
                    "destination": self.name,
                    "event_id": c.event.id,
                    "stream": stream,
                    "event_type": c.event.type,
                    "tenant": c.event.tenant,
                    "error": reason,
                    "attempts": attempts,
                },
            )
            out.append(Settlement(c.delivery_id, stream, kind, attempts, now, reason))
        return out, disable


def _describe(exc: BaseException) -> str:
    if isinstance(exc, RetryableError | PermanentError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"
