"""One subscription's runtime: per-stream lanes, retries, dead letters, replays.

Built by :meth:`outrelay.core.consumer.bus.EventBus.subscribe`; see that module for
the behaviour users rely on. Here, the mechanics:

* a receive loop pulls from the backend while fewer than ``prefetch``
  messages are unacked, and appends each to its stream's *lane*;
* a lane has at most one worker task (so a stream is never handled twice at
  once, and in arrival order); at most ``concurrency`` workers run;
* each event is upcast to its type's current version before the handler
  sees it (:func:`outrelay.core.history.upcasting.upcast`); an event with no
  upcaster path is dead-lettered (or parks its stream) at once;
* a parked stream's lane keeps its messages unacked and has no worker until
  the operator's replay succeeds or the dead letter is purged (seen by a
  poll of the dead-letter table every ``poll_interval`` seconds, which also
  takes queued replays);
* with tracing on (:mod:`outrelay.core.model.tracecontext`), each handler attempt
  on an event carrying a ``traceparent`` runs in a CONSUMER span under it;
* an ack tries :meth:`Inbound.ack_nowait` first and awaits ``ack`` only when
  it returns False (a backend that acks synchronously costs no coroutine);
* an event that needs none of the above (an async handler, no receive
  transforms, no upcasting, no span) goes to the handler straight from its
  lane's loop: the general path's steps, without its coroutines.

If the dead-letter database fails, nothing is acked: the lane waits a
second and handles its head again (the handler may then run again).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import inspect
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from outrelay.core.config.config import RetryPolicy
from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetter, ConsumerDeadLetters
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend
from outrelay.core.history.upcasting import default_upcasters, upcast
from outrelay.core.model import cloudevents, tracecontext
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError, OutrelayError, PermanentError, RetryableError, TransportError
from outrelay.core.relay.retry import backoff_delay

__all__ = ["Handler", "Subscription", "SubscriptionStats"]

log = logging.getLogger("outrelay.bus")

#: what ``subscribe`` takes: ``async def handler(event)`` or a plain function (run in a worker thread)
Handler = Callable[[Event], Awaitable[Any]] | Callable[[Event], Any]


@dataclasses.dataclass
class SubscriptionStats:
    """Counters of one subscription (this process only)."""

    handled: int = 0
    skipped: int = 0
    retries: int = 0
    dead_lettered: int = 0
    parked: int = 0
    replayed: int = 0
    #: the ``time`` of the last event handled, and when (Unix seconds) its handler returned
    last_event_time: datetime.datetime | None = None
    last_handled_at: float = 0.0

    @property
    def lag_seconds(self) -> float:
        """Seconds from the last handled event's ``time`` (set at append) to when it was handled: how
        far behind the producers this consumer was (0 before the first event)."""
        if self.last_event_time is None:
            return 0.0
        return max(0.0, self.last_handled_at - self.last_event_time.timestamp())


class Subscription:
    """A running subscription. :meth:`unsubscribe` stops it gracefully."""

    poll_interval = 2.0

    def __init__(
        self,
        backend: SubscriptionBackend,
        handler: Handler,
        *,
        consumer: str,
        member: str,
        types: tuple[str, ...],
        tenants: tuple[str, ...],
        streams: tuple[str, ...],
        retry: RetryPolicy,
        max_attempts: int,
        park: bool,
        concurrency: int,
        prefetch: int,
        dead_letters: ConsumerDeadLetters,
    ) -> None:
        self.backend = backend
        self.consumer = consumer
        self.member = member
        self.group = backend.spec.group
        self.stats = SubscriptionStats()
        #: set when the subscription stopped because of a PermanentError
        self.error: OutrelayError | None = None
        self._handler = handler
        self._is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
        )
        self._types = None if types in ((), ("*",)) else types
        self._tenants = tenants
        self._streams = streams
        #: any filter at all: without one, every event matches and _matches is not called
        self._filtered = self._types is not None or bool(tenants) or bool(streams)
        self._retry = retry
        self._max_attempts = max_attempts
        self._park = park
        self._slots = asyncio.Semaphore(concurrency)
        self._prefetch = prefetch
        self._dlq = dead_letters
        self._lanes: dict[str, deque[Inbound]] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._parked: dict[str, str | None] = {}  # stream -> event id of its parked head
        self._unacked = 0
        self._room = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self._closer: asyncio.Task[None] | None = None
        self.stopped = False
        self._done = asyncio.Event()
        #: plugins' receive transforms (claim-check, decryption), found when the subscription starts
        self._decoders: list[Callable[[Event], Any]] = []
        self._async_decoders = False  # some of them are async (they may do I/O)

    def __repr__(self) -> str:
        kind = f"group={self.group!r}" if self.group else "fan-out"
        return f"<Subscription {self.consumer!r} {kind} member={self.member!r}>"

    # -- lifecycle ----------------------------------------------------------

    async def start(self) -> None:
        tracecontext.enable_from_env()  # $OUTRELAY_TRACING: a subscriber-only process has no Outbox to read it
        await self.backend.start()
        try:
            heads = await asyncio.to_thread(self._dlq.parked_streams, self.consumer)
        except BaseException:
            await self.backend.stop()
            raise
        self._parked = dict.fromkeys(heads)
        self._decoders = await asyncio.to_thread(_receive_transforms, self.consumer)
        self._async_decoders = any(inspect.iscoroutinefunction(d) for d in self._decoders)
        self._tasks = [asyncio.create_task(self._receive_loop()), asyncio.create_task(self._dead_letter_loop())]

    async def unsubscribe(self, grace: float = 10.0) -> None:
        """Stop receiving, let running handlers finish (at most ``grace`` seconds,
        then cancel them), leave the group: what was not acked goes to other members."""
        if self.stopped:
            return
        self._stopping = True
        self._room.set()
        for t in self._tasks:
            t.cancel()
        workers = list(self._workers.values())
        if workers:
            _, late = await asyncio.wait(workers, timeout=grace)
            for t in late:
                t.cancel()
            if late:
                await asyncio.wait(late)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*self._tasks, return_exceptions=True)
        self.stopped = True
        try:
            await self.backend.stop()
        finally:
            self._done.set()

    async def wait(self) -> None:
        """Wait until the subscription stops (unsubscribed, or a PermanentError)."""
        await self._done.wait()

    # -- receiving ----------------------------------------------------------

    async def _receive_loop(self) -> None:
        failures = 0
        while not self._stopping:
            room = self._prefetch - self._unacked
            if room <= 0:
                self._room.clear()
                await self._room.wait()
                continue
            try:
                batch = await self.backend.receive(min(room, 500), timeout=1.0)
            except RetryableError as exc:
                failures += 1
                if failures == 1:
                    log.warning("subscription %s: %s; retrying", self.consumer, exc)
                await asyncio.sleep(min(5.0, 0.05 * 2**failures))
                continue
            except PermanentError as exc:
                log.error("subscription %s stopped: %s", self.consumer, exc)
                self.error = exc
                self._closer = asyncio.create_task(self.unsubscribe())
                return
            if failures:
                log.warning("subscription %s: receiving again after %d failed attempt(s)", self.consumer, failures)
                failures = 0
            self._unacked += len(batch)
            lanes, workers, parked = self._lanes, self._workers, self._parked
            for m in batch:
                stream = m.stream
                lane = lanes.get(stream)
                if lane is None:
                    lane = lanes[stream] = deque()
                lane.append(m)
                # _wake, inlined (its lane is not empty now): a worker unless one runs or the stream is parked
                if stream not in workers and stream not in parked:
                    workers[stream] = asyncio.create_task(self._work(stream))

    def _wake(self, stream: str) -> None:
        if stream in self._workers or stream in self._parked or not self._lanes.get(stream):
            return
        self._workers[stream] = asyncio.create_task(self._work(stream))

    async def _work(self, stream: str) -> None:
        try:
            async with self._slots:
                lane = self._lanes[stream]
                # the plain path (see _plain) and what it needs, looked up once: none of it changes during a run
                plain = self._is_async and not self._decoders
                handler: Callable[[Event], Awaitable[Any]] = self._handler  # async whenever plain
                current = default_upcasters().current
                while lane and not self._stopping and stream not in self._parked:
                    m = lane[0]
                    try:
                        event = self._plain(m, current) if plain else None
                        if event is None:
                            acked = await self._handle(m)
                        else:  # decoded, current, untraced: _handle's steps but the handler's call are done
                            try:
                                await handler(event)
                                outcome = None
                            except Exception as exc:
                                outcome = await self._retries(event, False, exc)
                            acked = await self._outcome(m, event, event, outcome)
                        if not acked:
                            break
                    except OutrelayError as exc:  # the dead-letter database failed: nothing was acked
                        log.error("subscription %s: stream %r waits: %s", self.consumer, stream, exc)
                        await asyncio.sleep(1.0)
                        continue
                    lane.popleft()
        finally:
            del self._workers[stream]
            if not self._lanes.get(stream):
                self._lanes.pop(stream, None)

    async def _ack(self, m: Inbound) -> None:
        """Ack ``m`` (counted off the prefetch window even when the ack fails)."""
        if not self._ack_nowait(m):
            await self._ack_awaited(m)

    def _ack_nowait(self, m: Inbound) -> bool:
        """:meth:`_ack` without a coroutine where ``m``'s backend acks synchronously
        (:meth:`Inbound.ack_nowait`). False, with nothing done: await :meth:`_ack_awaited`."""
        done = True  # also when ack_nowait raises: the message is off the window, as with an awaited ack
        try:
            done = m.ack_nowait()
        except TransportError as exc:  # it comes again: a duplicate, which the inbox absorbs
            log.warning("subscription %s: ack of %s failed (%s); it may come again", self.consumer, m.broker_id, exc)
        finally:
            if done:
                self._unacked -= 1
                self._room.set()
        return done

    async def _ack_awaited(self, m: Inbound) -> None:
        try:
            await m.ack()
        except TransportError as exc:  # it comes again: a duplicate, which the inbox absorbs
            log.warning("subscription %s: ack of %s failed (%s); it may come again", self.consumer, m.broker_id, exc)
        finally:
            self._unacked -= 1
            self._room.set()

    def _matches(self, e: Event) -> bool:
        if self._types is not None and not any(fnmatchcase(e.type, p) for p in self._types):
            return False
        if self._tenants and e.tenant not in self._tenants:
            return False
        return not self._streams or any(fnmatchcase(e.stream, p) for p in self._streams)

    # -- handling -----------------------------------------------------------

    def _plain(self, m: Inbound, current: Mapping[str, str]) -> Event | None:
        """``m``'s event if the (async) handler can be awaited on it as it is — decoded, passing
        the filters, at its type's current version (``current``: the upcasters' newest version
        per type) and with no trace context to continue — else None: :meth:`_handle` takes it.
        For a subscription without receive transforms only."""
        received = m.received
        if received is None:
            return None
        event = received.event
        if self._filtered and not self._matches(event):
            return None
        target = current.get(event.type)
        if target is not None and target != event.event_version:
            return None
        if tracecontext.active and "traceparent" in event.metadata:  # a CONSUMER span: _attempts
            return None
        return event

    async def _handle(self, m: Inbound) -> bool:
        """Handle the head of a lane. True: acked (handled, skipped or dead-lettered);
        False: left unacked (stopping, or its stream was parked)."""
        if m.received is None:
            await self._record_foreign(m)
            await self._ack(m)
            return True
        received = m.received.event
        if self._filtered and not self._matches(received):
            self.stats.skipped += 1
            await self._ack(m)
            return True
        try:  # handlers see resolved, decrypted events at their type's current version
            event = await self._decode_async(received) if self._async_decoders else self._decode(received)
        except EventError as exc:  # no key, altered data, no upcaster path: retrying cannot help
            return await self._give_up(m, received, received, (str(exc), 0, time.time()))
        return await self._outcome(m, received, event, await self._attempts(event))

    async def _outcome(self, m: Inbound, received: Event, event: Event, outcome: tuple[str, int, float] | None) -> bool:
        """After the attempts on ``event`` (``received`` as it came): ack it when handled, leave it
        unacked when stopping cut its attempts short, else dead-letter it (:meth:`_give_up`)."""
        if outcome is None:
            self.stats.handled += 1
            self.stats.last_event_time, self.stats.last_handled_at = event.time, time.time()
            await self._ack(m)
            return True
        if self._stopping and outcome[1] < self._max_attempts:
            return False
        return await self._give_up(m, received, event, outcome)

    async def _give_up(self, m: Inbound, received: Event, event: Event, outcome: tuple[str, int, float]) -> bool:
        """Dead-letter ``event`` (decoding failed, or the attempts ran out), then park its stream
        (False: ``m`` stays unacked) or ack ``m`` (True). ``received`` is the event as it came."""
        reason, attempts, first = outcome
        # with decoders, the dead letter keeps the event as received (ciphertext stays ciphertext)
        kept = received if self._decoders else event
        await self._record(event, reason, attempts, first, "parked" if self._park else "dead", kept)
        if self._park:
            self.stats.parked += 1
            self._parked[event.stream] = event.id
            return False
        self.stats.dead_lettered += 1
        await self._ack(m)
        return True

    def _decode(self, event: Event) -> Event:
        """Plugins' receive transforms (decryption), then upcasting.

        :raises EventError: the reason, naming the step that failed."""
        if self._decoders:
            try:
                for decode in self._decoders:
                    event = decode(event)
            except EventError as exc:
                raise EventError(f"cannot decode: {exc}") from None
        return self._upcast(event)

    async def _decode_async(self, event: Event) -> Event:
        """:meth:`_decode` when some receive transforms are ``async`` (the claim-check fetches
        payloads). Their RetryableError propagates: the event stays unacked and its lane waits.

        :raises EventError: the reason, naming the step that failed."""
        try:
            for decode in self._decoders:
                out = decode(event)
                event = await out if inspect.isawaitable(out) else out
        except EventError as exc:
            raise EventError(f"cannot decode: {exc}") from None
        return self._upcast(event)

    def _upcast(self, event: Event) -> Event:
        # upcast() returns the event itself when its type has no upcasters or it is current: one lookup here
        target = default_upcasters().current.get(event.type)
        if target is None or target == event.event_version:
            return event
        try:
            return upcast(event)
        except EventError as exc:
            raise EventError(f"cannot upcast: {exc}") from None

    async def _attempts(self, event: Event) -> tuple[str, int, float] | None:
        """Call the handler until it succeeds (None) or the attempts run out
        (reason, attempts, first failure time). Stops early when unsubscribing."""
        traced = tracecontext.active and "traceparent" in event.metadata
        try:
            await self._attempt(event, traced)
        except Exception as exc:
            return await self._retries(event, traced, exc)
        return None

    async def _attempt(self, event: Event, traced: bool) -> None:
        """One call of the handler; with tracing on (``traced``), in a CONSUMER span
        continuing the producer's trace."""
        with tracecontext.consuming(event, self.consumer) if traced else contextlib.nullcontext():
            if self._is_async:
                await self._handler(event)
            else:
                result = await asyncio.to_thread(self._handler, event)  # copies the span's context
                if inspect.isawaitable(result):
                    await result

    async def _retries(self, event: Event, traced: bool, exc: Exception) -> tuple[str, int, float] | None:
        """The rest of :meth:`_attempts` once the first attempt raised ``exc``: back off and
        call again until the handler succeeds (None) or the attempts run out."""
        reason, first, attempt = f"{type(exc).__name__}: {exc}", time.time(), 1
        while attempt < self._max_attempts and not self._stopping:
            self.stats.retries += 1
            log.debug("subscription %s: event %s failed (%s); attempt %d", self.consumer, event.id, reason, attempt)
            await asyncio.sleep(backoff_delay(self._retry, attempt))
            attempt += 1
            try:
                await self._attempt(event, traced)
            except Exception as again:
                reason = f"{type(again).__name__}: {again}"
            else:
                return None
        return reason, attempt, first

    async def _record(
        self, event: Event, reason: str, attempts: int, first: float, state: str, kept: Event | None = None
    ) -> None:
        log.warning(
            "subscription %s: event %s (%s, stream %r) %s after %d attempt(s): %s",
            self.consumer, event.id, event.type, event.stream,
            "parked its stream" if state == "parked" else "dead-lettered", attempts, reason,
        )  # fmt: skip
        await asyncio.to_thread(
            self._dlq.record,
            consumer=self.consumer,
            member=self.member,
            event_id=event.id,
            type=event.type,
            stream=event.stream,
            tenant=event.tenant,
            body=cloudevents.to_structured(event if kept is None else kept),
            content_type=cloudevents.STRUCTURED_CONTENT_TYPE,
            reason=reason,
            attempts=attempts,
            first_failed_at=first,
            failed_at=time.time(),
            state=state,
        )

    async def _record_foreign(self, m: Inbound) -> None:
        reason = f"not an outrelay CloudEvent: {m.error}"
        log.warning("subscription %s: message %s dead-lettered: %s", self.consumer, m.broker_id or "?", reason)
        now = time.time()
        await asyncio.to_thread(
            self._dlq.record,
            consumer=self.consumer, member=self.member, event_id=m.broker_id, type="", stream=m.stream,
            tenant=None, body=b"", content_type=None, reason=reason, attempts=0, first_failed_at=now,
            failed_at=now,
        )  # fmt: skip
        self.stats.dead_lettered += 1

    # -- operator actions ---------------------------------------------------

    async def _dead_letter_loop(self) -> None:
        while not self._stopping:
            await asyncio.sleep(self.poll_interval)
            try:
                for dl in await asyncio.to_thread(self._dlq.take_queued, self.consumer, self.member):
                    await self._replay(dl)
                heads = await asyncio.to_thread(self._dlq.parked_streams, self.consumer)
            except OutrelayError as exc:
                log.warning("subscription %s: dead letters unavailable: %s", self.consumer, exc)
                continue
            for stream in heads.difference(self._parked):  # parked by another member of the group
                self._parked[stream] = None
            for stream in set(self._parked).difference(heads):  # purged: skip that event, resume the stream
                await self._unpark(stream, self._parked[stream])

    async def _replay(self, dl: ConsumerDeadLetter) -> None:
        was_parked = dl.state == "replaying-parked"
        now = time.time()
        if not dl.type:
            await asyncio.to_thread(self._dlq.finish, dl.id, state="dead", now=now)
            log.warning("subscription %s: dead letter %d is not an event and cannot be replayed", self.consumer, dl.id)
            return
        event = cloudevents.from_structured(dl.body)
        try:
            event = self._decode(event) if self._decoders else event  # kept as received: decode again
        except EventError as exc:
            outcome: tuple[str, int, float] | None = (str(exc), 0, now)
        else:
            outcome = await self._attempts(event)
        if outcome is None:
            self.stats.replayed += 1
            await asyncio.to_thread(self._dlq.finish, dl.id, state="replayed", now=time.time())
            if was_parked:
                await self._unpark(dl.stream, dl.event_id)
            return
        reason, attempts, _ = outcome
        again = "parked" if was_parked else "dead"
        await asyncio.to_thread(
            self._dlq.finish, dl.id, state=again, reason=reason, attempts=dl.attempts + attempts, now=time.time()
        )

    async def _unpark(self, stream: str, event_id: str | None) -> None:
        """Resume a parked stream; its held head is acked unhandled when it is the
        event that was replayed or purged."""
        self._parked.pop(stream, None)
        lane = self._lanes.get(stream)
        if lane and event_id is not None and lane[0].received is not None and lane[0].received.event.id == event_id:
            await self._ack(lane.popleft())
        self._wake(stream)


def _receive_transforms(consumer: str) -> list[Callable[[Event], Any]]:
    """What plugins apply to received events (``outrelay_receive_transform``), through
    the process's plugin registry (:func:`~outrelay.core.config.registry.get_registry`)."""
    from outrelay.core.config.registry import get_registry

    return list(get_registry().pm.hook.outrelay_receive_transform(consumer=consumer))
