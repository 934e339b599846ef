"""The relay: reads the outbox and publishes through transports.

``Relay(outbox, config)`` then ``await relay.run()`` (until :meth:`stop`) or
``await relay.run(drain=True)`` (until nothing is left to do). One router
task fans new events out to destinations; one :class:`DestinationWorker` per
destination claims, sends and settles. Store calls run in worker threads so
the event loop never blocks on the database.

While batches are in flight the relay renews its lane leases every third of
``relay.lease_seconds``, so a slow send never lets its lanes be claimed again
(re-sends happen only after a crash or a lost database connection). Each
attempt (a whole ``transport.send``) has a deadline, the destination's
``attempt_timeout``. Claims stay within ``relay.max_batch_bytes`` and, for all
destinations together, ``relay.max_in_flight_bytes`` of event data.

Shutdown (:meth:`stop`, or SIGINT/SIGTERM via the CLI) stops claiming, tells
the sends in flight to start no further message, waits
``relay.shutdown_grace`` seconds for them, settles what finished, cancels the
rest — settling what their transports reported confirmed — and releases the
leases of what did not; nothing is lost, and nothing confirmed is sent again.
:meth:`run` returns within ``shutdown_grace`` + about ``4 * STOP_STEP``
seconds whatever transports do: each later shutdown step (cancelled sends,
closing transports, the final store calls) is abandoned after ``STOP_STEP``
seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from outrelay.core.config.config import DestinationConfig, OutrelayConfig
from outrelay.core.config.registry import Registry, get_registry
from outrelay.core.contract.transport import Transport
from outrelay.core.history import audit
from outrelay.core.model.errors import ConfigError, StoreError, UsageError
from outrelay.core.relay.attempts import AttemptLog, AttemptStore
from outrelay.core.relay.budget import ByteBudget
from outrelay.core.relay.destination import DestinationWorker
from outrelay.core.relay.handoff import RoutingHandoff
from outrelay.core.relay.routing import Router
from outrelay.core.relay.unrouted import UnroutedReport
from outrelay.core.stores.base import Claimed, DestinationStatus, InlineRefused
from outrelay.core.stores.outbox import Outbox

__all__ = ["Relay", "RunSummary", "build_transports"]

log = logging.getLogger("outrelay.relay")
T = TypeVar("T")

#: seconds each shutdown step after the grace period may take before it is abandoned
STOP_STEP = 1.0


@dataclasses.dataclass(frozen=True)
class _Loops:
    """The tasks of a run: the main loops (any of them failing ends the run), the lease
    renewer and the attempt log's pruner."""

    main: list[asyncio.Task[None]]
    renewer: asyncio.Task[None]
    pruner: asyncio.Task[None] | None


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What a run did; ``remaining`` counts deliveries still pending; ``unrouted`` counts, per
    reason, the events no destination matched (see :mod:`outrelay.core.relay.unrouted`)."""

    counts: dict[str, dict[str, int]]
    status: list[DestinationStatus]
    elapsed: float
    unrouted: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def remaining(self) -> int:
        return sum(s.pending for s in self.status)

    @property
    def dead_lettered(self) -> int:
        return sum(c["dead_lettered"] + c["parked"] for c in self.counts.values())


def build_transports(config: OutrelayConfig, registry: Registry) -> dict[str, Transport]:
    """Instantiate every configured destination's transport (no I/O).

    :raises ConfigError: unknown transport, missing extra, invalid options — every
        destination's problems at once (one error is raised as it is).
    """
    built: dict[str, Transport] = {}
    errors: list[ConfigError] = []
    for name, d in config.destinations.items():
        try:
            built[name] = registry.create_transport(d.transport, d.options, destination=name)
        except ConfigError as exc:  # go on: the operator fixes all of them in one edit
            errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigError("; ".join(str(e) for e in errors))
    return built


class Relay:
    """See the module docstring.

    ``transports`` adds ready-made transport instances (embedding, tests);
    their destination options default to :class:`DestinationConfig` values
    unless ``config.destinations`` names them too.
    """

    #: seconds between retention rounds, and rows deleted per retention transaction
    retention_interval: float = 60.0
    retention_batch: int = 500

    def __init__(
        self,
        outbox: Outbox | str | None = None,
        config: OutrelayConfig | None = None,
        *,
        transports: Mapping[str, Transport] | None = None,
        registry: Registry | None = None,
    ) -> None:
        self.config = config or OutrelayConfig()
        if outbox is None:
            outbox = self.config.outbox.url
        if isinstance(outbox, str):
            self.outbox = Outbox.open(outbox, max_event_bytes=self.config.outbox.max_event_bytes)
        else:
            self.outbox = outbox
        self._owns_outbox = isinstance(outbox, str)
        self.store = self.outbox.store
        self.registry = registry or get_registry().copy()
        self.hook = self.registry.pm.hook
        built = build_transports(self.config, self.registry) if self.config.destinations else {}
        built.update(transports or {})
        if not built:
            raise ConfigError("no destinations configured; add a [destinations.NAME] table")
        self.transports = built
        self.router = Router(
            self.config.routes, built, {n: d.tenants for n, d in self.config.destinations.items() if d.tenants}
        )
        #: events that matched no destination: logged once per type, counted, recorded for `status`
        self.unrouted_report = UnroutedReport(self.router, self.outbox.url, self.db)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        #: the audit chain this relay records in (``[audit] enabled``), else None
        self.audit = audit.enable(self.store, self.config, f"relay:{self.owner}") if self.config.audit.enabled else None
        #: the delivery-attempt log (``[attempts] enabled``), else None; the store then records it
        self.attempt_log = AttemptLog(self.config.attempts) if self.config.attempts.enabled else None
        if isinstance(self.store, AttemptStore):
            self.store.attempts_keep = self.config.attempts.keep_per_event
        else:
            self.attempt_log = None
        self.stopping = False
        self._running = False
        self._route_wake: asyncio.Event | None = None
        #: set by run(): the store's route-then-claim in one transaction (PostgreSQL without the audit
        #: chain), which destinations use to route new appends; None: the router routes them
        self.route_and_claim: Callable[..., tuple[int, list[Claimed]]] | None = None
        self._fast_poll_until = 0.0
        self._route_busy = False
        self._executor = ThreadPoolExecutor(max_workers=self.store.max_workers, thread_name_prefix="outrelay-store")
        self.workers: dict[str, DestinationWorker] = {}
        #: who routes new appends when the store routes and claims in one transaction
        self.handoff = RoutingHandoff(self.workers_values, self._wake_router, linger=self.config.relay.linger)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = -1  # threading.get_ident() of the loop's thread, once running
        self._slow_calls: set[str] = set()  # inline_methods whose last call took over the store's inline_seconds
        cfg = self.config.relay
        self.budget = ByteBudget(cfg.max_in_flight_bytes, cfg.max_batch_bytes)

    async def db(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run a store call in the store's thread(s) — or in this loop's thread, when ``fn`` is one of the
        store's :attr:`~outrelay.core.stores.base.RelayStore.inline_methods`, its last call took under
        its :attr:`~outrelay.core.stores.base.RelayStore.inline_seconds`, and the store can run it
        without waiting (a relay at a trickle: two thread hand-offs fewer per call; a draining relay's
        longer calls keep overlapping its sends)."""
        call: Callable[[], T] = functools.partial(fn, *args, **kwargs)
        name = getattr(fn, "__name__", "")
        if name not in self.store.inline_methods or getattr(fn, "__self__", None) is not self.store:
            return await asyncio.get_running_loop().run_in_executor(self._executor, call)
        if name not in self._slow_calls:
            started = time.perf_counter()
            try:
                result: T = self.store.call_inline(call)
            except InlineRefused:
                pass
            else:
                if time.perf_counter() - started > self.store.inline_seconds:
                    self._slow_calls.add(name)
                return result

        def timed() -> T:
            started = time.perf_counter()
            try:
                return call()
            finally:
                if time.perf_counter() - started > self.store.inline_seconds:
                    self._slow_calls.add(name)
                else:
                    self._slow_calls.discard(name)

        return await asyncio.get_running_loop().run_in_executor(self._executor, timed)

    # -- public control ----------------------------------------------------------

    def stop(self) -> None:
        """Ask the relay to stop (idempotent; safe from signal handlers)."""
        self.stopping = True
        self.budget.close()
        if self._route_wake is not None:
            self._route_wake.set()
        for w in self.workers.values():
            w.stop_sending()  # sends in flight start nothing new; what they finish is settled
            w.wake.set()

    def wake(self, pending_commit: bool = False) -> None:
        """Thread-safe: new events were appended (``pending_commit``: in a
        caller's transaction that is not committed yet — poll fast a while)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        if pending_commit:
            self._fast_poll_until = time.monotonic() + 2.0
            if self._route_wake is not None:
                loop.call_soon_threadsafe(self._route_wake.set)
        else:
            loop.call_soon_threadsafe(self._appended)

    def _appended(self) -> None:
        """In the loop: committed appends are waiting. Where the store routes and claims in one
        transaction, the next destination to claim routes them (see :class:`RoutingHandoff`)."""
        if self.route_and_claim is None:
            self._wake_router()
        else:
            self.handoff.appended()

    def _wake_router(self) -> None:
        if self._route_wake is not None:
            self._route_wake.set()

    def workers_values(self) -> Iterable[DestinationWorker]:
        """The destinations' workers (for the hand-off's wake-ups)."""
        return self.workers.values()

    def routed(self, count: int, started: float, *, by: DestinationWorker | None = None) -> None:
        """``count`` events were routed (by the router, or by the claim of destination ``by``): report
        them and wake the destinations (but ``by``, whose claim in the same transaction saw them); a
        full batch (``route_batch``) may have left more for the router."""
        if not count:
            return
        self.hook.outrelay_routed(count=count, started=started, finished=time.time())
        self.unrouted_report.note()
        for w in self.workers.values():
            if w is not by:
                w.wake.set()
        if count >= self.config.relay.route_batch and self._route_wake is not None:
            self._route_wake.set()

    def _on_store_notice(self, what: str) -> None:
        """Thread-safe: another process appended (wake the router) or routed
        (wake the destination workers, which would otherwise wait a poll)."""
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        # from this loop's thread (SQLite's watch in the loop) at once, from another one through the loop
        direct = threading.get_ident() == self._loop_thread
        for fn in [w.wake.set for w in self.workers.values()] if what == "routed" else [self._appended]:
            if direct:
                fn()
            else:
                loop.call_soon_threadsafe(fn)

    async def run(self, *, drain: bool = False) -> RunSummary:
        """Relay until :meth:`stop` (or, with ``drain``, until idle).

        :raises StoreLockedError: another relay serves this SQLite outbox.
        """
        if self._running:
            raise UsageError("this Relay is already running")
        self._running = True
        started = time.monotonic()
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._route_wake = asyncio.Event()
        self.budget = ByteBudget(self.config.relay.max_in_flight_bytes, self.config.relay.max_batch_bytes)
        await self._register()
        gc_before = gc.get_threshold()
        if self.config.relay.gc_threshold is not None:
            gc.set_threshold(self.config.relay.gc_threshold, *gc_before[1:])
        combined = getattr(self.store, "route_and_claim", None)
        audited = self.audit is not None or getattr(self.store, "audit", None) is not None
        self.route_and_claim = combined if callable(combined) and not audited else None
        unsubscribe = self.outbox.add_listener(self.wake)
        # other processes' appends (PostgreSQL NOTIFY; SQLite: a WAL watch in this loop where it can)
        if self.store.listens_in_loop:
            unlisten = self.store.listen(self._on_store_notice, loop=self._loop)  # type: ignore[call-arg]
        else:
            unlisten = self.store.listen(self._on_store_notice)
        self.workers = {
            name: DestinationWorker(
                self, name, t, self.config.destinations.get(name) or DestinationConfig(transport=t.name)
            )
            for name, t in self.transports.items()
        }
        loops = self._start_loops(drain)
        self.hook.outrelay_relay_started(relay=self)
        status: list[DestinationStatus] = []
        try:
            done, _ = await asyncio.wait(loops.main, return_when=asyncio.FIRST_EXCEPTION)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
        finally:
            try:
                await self._stop_loops(loops)
                unsubscribe()
                unlisten()
                status = await self._unregister()
            finally:
                gc.set_threshold(*gc_before)
                self._running = False
        counts = {n: dict(w.counts) for n, w in self.workers.items()}
        return RunSummary(counts, status, time.monotonic() - started, self.unrouted_report.by_reason())

    async def _register(self) -> None:
        """Take the outbox for this relay (and record the run's start in the audit chain)."""
        try:
            await self.db(self.store.acquire_relay, self.owner)
        except BaseException:
            self._running = False  # e.g. StoreLockedError: this Relay may try again later
            raise
        if self.audit is not None:
            try:
                await self.db(audit.record_start, self.store, self.audit, self.config, self.owner, time.time())
            except BaseException:  # no run without its start on record
                await self._release()
                self._running = False
                raise

    def _start_loops(self, drain: bool) -> _Loops:
        """Start the router, one loop per destination, retention and (``drain``) the drain monitor
        (the main loops), and the lease renewer and the attempt log's pruner beside them."""
        tasks = [asyncio.create_task(self._route_loop(), name="outrelay-router")]
        tasks += [asyncio.create_task(w.run(), name=f"outrelay-{n}") for n, w in self.workers.items()]
        if self.config.outbox.retention_days is not None or self.config.outbox.retention_per_stream is not None:
            tasks.append(asyncio.create_task(self._retention_loop(), name="outrelay-retention"))
        if drain:
            tasks.append(asyncio.create_task(self._drain_monitor()))
        renewer = asyncio.create_task(self._lease_loop(), name="outrelay-leases")
        pruner = None  # the attempt log's retention: not awaited at stop (it sleeps a minute between rounds)
        if self.attempt_log is not None and self.config.attempts.keep_days is not None:
            pruner = asyncio.create_task(self._attempts_retention_loop(), name="outrelay-attempts")
        return _Loops(tasks, renewer, pruner)

    async def _stop_loops(self, loops: _Loops) -> None:
        """Stop claiming, give the batches in flight ``shutdown_grace``, then stop the renewer and
        the pruner and close the transports (each later step bounded by ``STOP_STEP``)."""
        self.stop()
        self.handoff.close()
        for t in loops.main:
            if not t.done():
                t.cancel()
        await _bounded(asyncio.gather(*loops.main, return_exceptions=True), "stopping the relay's loops")
        grace = self.config.relay.shutdown_grace
        await asyncio.gather(*(w.drain_inflight(grace, STOP_STEP) for w in self.workers.values()))
        loops.renewer.cancel()  # after the grace: batches finishing in it keep their leases
        if loops.pruner is not None:
            loops.pruner.cancel()
            await asyncio.gather(loops.pruner, return_exceptions=True)
        await asyncio.gather(*(self._close_transport(w) for w in self.workers.values()))

    async def _unregister(self) -> list[DestinationStatus]:
        """Record the unrouted counts, release the leases and read the final status (each bounded;
        a store call stuck in a thread is abandoned), then close the executor (and the outbox
        this relay opened). Returns the status, empty when the release did not finish."""
        status: list[DestinationStatus] = []
        await _bounded(self.unrouted_report.close(), "recording unrouted events")
        clean = await _bounded(self._release(), "releasing leases")
        if clean:
            with contextlib.suppress(StoreError):  # the summary then lacks pending counts; nothing else
                status = await self.db(self.store.status, list(self.workers), time.time())
        self.hook.outrelay_relay_stopped(relay=self)
        # a store call stuck in a thread is abandoned: its thread must not hold up the exit
        self._executor.shutdown(wait=clean, cancel_futures=True)
        if self._owns_outbox and clean:
            self.outbox.close()
        return status

    async def _close_transport(self, w: DestinationWorker) -> None:
        try:
            await _bounded(w.transport.close(), f"closing destination {w.name}")
        except Exception as exc:
            log.warning(
                "destination %s: close failed: %s",
                w.name,
                type(exc).__name__,
                extra={"destination": w.name, "error": type(exc).__name__},
            )

    async def _release(self) -> None:
        try:
            await self.db(self.store.release_relay, self.owner)
        except StoreError as exc:  # the leases expire by themselves; the next relay takes over then
            log.warning(
                "could not release leases (%s); they expire after relay.lease_seconds", exc, extra={"error": str(exc)}
            )

    # -- internal loops ------------------------------------------------------------

    async def _route_loop(self) -> None:
        assert self._route_wake is not None
        cfg = self.config.relay
        route = self.router
        store_delay = 0.5
        while not self.stopping:
            self._route_wake.clear()
            self._route_busy = True
            combined = self.route_and_claim is not None
            # while a destination routes (route_and_claim), it takes the new appends next: skip this round
            routing = self.handoff.take(router=True) if combined else True
            try:
                started = time.time()
                n = await self.db(self.store.route, route, cfg.route_batch, started) if routing else 0
                store_delay = 0.5
            except StoreError as exc:  # database down or locked: wait and try again, nothing is lost
                log.warning(
                    "router: outbox unavailable (%s); retrying in %.1fs", exc, store_delay, extra={"error": str(exc)}
                )
                n = 0
                await asyncio.sleep(store_delay)
                store_delay = min(store_delay * 2, 30.0)
            finally:
                self._route_busy = False
                if combined and routing:
                    self.handoff.done()
            self.routed(n, started)
            if n == cfg.route_batch:
                continue
            timeout = 0.02 if time.monotonic() < self._fast_poll_until else cfg.poll_interval
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._route_wake.wait(), timeout=timeout)

    async def _lease_loop(self) -> None:
        """Renew this relay's lane leases while any batch is in flight."""
        lease = self.config.relay.lease_seconds
        while True:
            await asyncio.sleep(lease / 3)
            if not any(w.inflight for w in self.workers.values()):
                continue
            try:
                await self.db(self.store.renew_leases, self.owner, lease, time.time())
            except StoreError as exc:  # try again next time; the lease has two more thirds to go
                log.warning("could not renew leases (%s); retrying in %.1fs", exc, lease / 3, extra={"error": str(exc)})

    async def _retention_loop(self) -> None:
        """Prune delivered history every :attr:`retention_interval` seconds, one
        :attr:`retention_batch`-row transaction per store call, so deliveries
        interleave between batches."""
        interval, batch = self.retention_interval, self.retention_batch
        days = self.config.outbox.retention_days
        keep = self.config.outbox.retention_per_stream
        while not self.stopping:
            cutoff = None if days is None else time.time() - days * 86400
            removed = 0
            try:
                while not self.stopping:
                    n = await self.db(self.store.prune, cutoff, keep_last=keep, batch=batch, max_batches=1)
                    removed += n
                    if n < batch:
                        break
                    await asyncio.sleep(0.01)  # let the router's and destinations' store calls in
            except StoreError as exc:  # history can wait for the next round; delivery must not stop for it
                log.warning(
                    "retention: pruning failed (%s); retrying in %.0fs", exc, interval, extra={"error": str(exc)}
                )
            if removed:
                log.info(
                    "retention: removed %d delivered events (older than %s days / beyond %s per stream)",
                    removed,
                    days,
                    keep,
                )
            await asyncio.sleep(interval)

    async def _attempts_retention_loop(self) -> None:
        """Delete logged attempts older than ``[attempts] keep_days`` every
        :attr:`retention_interval` seconds, :attr:`retention_batch` rows per transaction."""
        interval, batch = self.retention_interval, self.retention_batch
        store = self.store
        assert isinstance(store, AttemptStore) and self.config.attempts.keep_days is not None
        days = self.config.attempts.keep_days
        while not self.stopping:
            try:
                while not self.stopping:
                    if await self.db(store.prune_attempts, time.time() - days * 86400, batch=batch) < batch:
                        break
                    await asyncio.sleep(0.01)  # let the destinations' settles in
            except StoreError as exc:  # the log can wait for the next round
                log.warning("attempt log retention failed (%s); retrying in %.0fs", exc, interval)
            await asyncio.sleep(interval)

    async def _drain_monitor(self) -> None:
        bound = self.config.relay.drain_retry_bound
        quiet = 0
        logged_wait = False
        while not self.stopping:
            await asyncio.sleep(0.05)
            if self._route_busy or any(w.inflight for w in self.workers.values()):
                quiet = 0  # obviously busy: spare the store thread the queries below
                continue
            now = time.time()
            busy = await self.db(self.store.unrouted) > 0
            if not busy:
                for name, w in self.workers.items():
                    if not w.opened:
                        # still trying to connect: wait up to the bound, then give up
                        if w.failing_since is None or now - w.failing_since < bound:
                            busy = True
                            break
                        continue
                    next_due = await self.db(self.store.next_due, name)
                    if w.idle_until(now, next_due) <= now + bound:
                        busy = True
                        break
                    # another relay (perhaps a crashed one) holds lanes: wait for it to settle them or for
                    # the lease to run out (at most relay.lease_seconds), then claim them
                    held = await self.db(self.store.leased_elsewhere, name, self.owner, now)
                    if held is not None:
                        if not logged_wait:
                            log.info(
                                "drain: destination %s has lanes leased by another relay until %.0fs from now; "
                                "waiting for them",
                                name,
                                held - now,
                            )
                            logged_wait = True
                        busy = True
                        break
            quiet = 0 if busy else quiet + 1
            if quiet >= 2:
                self.stop()
                return


async def _bounded(aw: Any, what: str) -> bool:
    """Await ``aw`` for at most :data:`STOP_STEP` seconds; on expiry cancel it
    without waiting for it to obey, and return False."""
    task = asyncio.ensure_future(aw)
    done, _ = await asyncio.wait({task}, timeout=STOP_STEP)
    if done:
        task.result()
        return True
    task.cancel()
    log.warning("%s took longer than %.0fs; abandoned", what, STOP_STEP)
    return False
