"""The transport contract: everything a transport author implements.

A transport is a class with a frozen config model, declared capabilities,
and four coroutines::

    class MyTransport(Transport):
        name = "mine"
        Config = MyConfig                 # a TransportConfig subclass

        async def open(self) -> None: ...
        async def send(self, batch) -> list[SendResult]: ...
        async def close(self) -> None: ...
        async def check(self) -> str: ...
        def target(self, event) -> str: ...   # topic/subject/queue for event

Guarantees a transport gives the relay:

* ``send`` returns exactly one :class:`SendResult` per message, in order:
  :class:`Delivered`, :class:`RetryLater` or :class:`Rejected`. It never
  raises a vendor exception; a failure of the whole batch may be raised as
  :class:`~outrelay.RetryableError`/:class:`~outrelay.PermanentError`, which
  the relay applies to every message of the batch.
* If ``capabilities.ordered_batches`` is true, a batch may hold several
  messages with the same ``key``; the transport delivers them in batch order
  and, once one of them fails, delivers none of the later ones with that key
  (it reports them :class:`RetryLater`). Otherwise the relay never puts two
  messages with one key in a batch. A transport may instead *pipeline* a
  key's messages on one connection that the broker processes in order (a
  lost connection then loses a tail, never a hole): it must not publish
  after a local failure of the key, and reports outcomes that arrived
  together through :func:`hold_after_failures` (:func:`send_pipelined` does
  both) — the only order break left is a broker refusing one message and
  accepting the next, which is logged.
* ``open`` may fail with RetryableError (broker down): the relay retries it.
  ``close`` is idempotent. ``send`` after ``close`` raises
  :class:`~outrelay.UsageError`.
* ``check`` probes connectivity and permission to publish; it returns a short
  human line or raises a TransportError whose message says what to fix.

``reader()`` returns a :class:`Reader` (consumer side) when the transport
provides one (``capabilities.reader``); the conformance suite uses it.
``subscription()`` returns a subscription backend (consumer groups and
fan-out) when ``capabilities.subscriptions`` is set; the subscriber runtime
uses it (contract: :mod:`outrelay.core.subscription`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import logging
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pydantic import BaseModel, ConfigDict

from outrelay.core.envelope import Event

if TYPE_CHECKING:
    from outrelay.core.subscription import SubscriptionBackend, SubscriptionSpec

__all__ = [
    "Capabilities",
    "Delivered",
    "Message",
    "Reader",
    "Received",
    "Rejected",
    "RetryLater",
    "SendResult",
    "Transport",
    "TransportConfig",
    "hold_after_failures",
    "not_sent",
    "send_chained",
    "send_in_key_order",
    "send_in_waves",
    "send_pipelined",
]


class TransportConfig(BaseModel):
    """Base of every transport's config model: frozen, unknown keys rejected.

    Declare secrets as :class:`pydantic.SecretStr` so they never print.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", hide_input_in_errors=True)


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    """What a transport can do; the relay and the conformance suite obey it.

    ``max_message_bytes`` bounds the encoded size of one message (the
    conformance suite sends exactly that many payload bytes, then one more,
    which must be :class:`Rejected`). ``dedupe_window`` is in seconds, or
    ``None`` when ``native_dedupe`` holds for ever (or does not apply).
    """

    ordering_by_key: bool = True
    ordered_batches: bool = False
    native_dedupe: bool = False
    dedupe_window: float | None = None
    max_batch_count: int = 100
    max_batch_bytes: int | None = None
    max_message_bytes: int | None = None
    max_header_bytes: int | None = None
    cloudevents_modes: tuple[str, ...] = ("structured",)
    reader: bool = False
    #: the transport offers subscriptions (consumer groups and fan-out) through
    #: :meth:`Transport.subscription` (see :mod:`outrelay.core.subscription`)
    subscriptions: bool = False
    #: ``"at_least_once"``: Delivered means stored, a consumer attaching later still gets it; ``"at_most_once"``:
    #: only consumers attached at send time get it, nothing is kept (Redis Pub/Sub, MQTT without sessions)
    delivery: str = "at_least_once"


@dataclasses.dataclass(frozen=True, slots=True)
class Message:
    """One event on its way to one destination.

    ``target`` is the rendered topic/subject/queue/URL path for this event;
    ``key`` the ordering key (the event's stream); ``attempt`` counts from 1.
    """

    event: Event
    target: str
    key: str
    attempt: int = 1


class SendResult:
    """Base of the three per-message outcomes."""

    __slots__ = ()


@dataclasses.dataclass(frozen=True, slots=True)
class Delivered(SendResult):
    """The broker confirmed the message (``duplicate``: it already had it)."""

    duplicate: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class RetryLater(SendResult):
    """A transient failure; ``retry_after`` is the broker's hint in seconds."""

    error: str
    retry_after: float | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Rejected(SendResult):
    """A permanent failure. ``disable_destination``: stop the whole
    destination until an operator re-enables it (e.g. webhook 410 Gone);
    the message then stays pending instead of being dead-lettered."""

    reason: str
    disable_destination: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Received:
    """A message read back by a :class:`Reader`, decoded to an Event.

    ``headers`` holds the protocol's raw headers/attributes as strings,
    ``body`` the raw payload bytes, ``key`` the broker's ordering key.
    """

    event: Event
    target: str
    key: str | None
    headers: dict[str, str]
    body: bytes
    content_type: str | None = None


class Reader(ABC):
    """Consumer side of a transport: reads back what was published.

    Use as ``async with transport.reader(target) as r: await r.read(n, timeout)``.
    A reader only sees messages published after it was entered, unless the
    transport documents otherwise.
    """

    async def __aenter__(self) -> Reader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @abstractmethod
    async def start(self) -> None:
        """Subscribe/attach; afterwards published messages are captured."""

    @abstractmethod
    async def read(self, count: int, timeout: float) -> list[Received]:
        """Return up to ``count`` messages, waiting at most ``timeout`` seconds."""

    @abstractmethod
    async def stop(self) -> None:
        """Detach and free resources; idempotent."""


class Transport(ABC):
    """Base class of every transport (see the module docstring)."""

    name: ClassVar[str]
    Config: ClassVar[type[TransportConfig]] = TransportConfig
    #: for ``outrelay conformance``: the config option holding the target
    #: (None: guessed from target/topic/subject/queue/... names)
    conformance_target_option: ClassVar[str | None] = None
    #: for ``outrelay conformance``: options that make the transport unreachable
    #: (None: the broker-down checks skip with a reason)
    conformance_unreachable_options: ClassVar[Mapping[str, Any] | None] = None

    def __init__(self, config: TransportConfig, *, destination: str = "default") -> None:
        self.config = config
        self.destination = destination

    @property
    def capabilities(self) -> Capabilities:
        """Declared capabilities; may depend on the config."""
        return Capabilities()

    @abstractmethod
    async def open(self) -> None:
        """Connect. :raises RetryableError: when the broker is unreachable."""

    @abstractmethod
    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        """Publish ``batch``; one result per message, in order."""

    @abstractmethod
    async def close(self) -> None:
        """Flush and disconnect; idempotent."""

    def target(self, event: Event) -> str:
        """The topic/subject/queue/path ``event`` goes to (usually a rendered
        :class:`~outrelay.core.templates.Template`); must not fail."""
        return ""

    async def check(self) -> str:
        """Probe connectivity and publish permission; return a short summary."""
        await self.open()
        try:
            return "reachable"
        finally:
            await self.close()

    def reader(self, target: str, **options: Any) -> Reader:
        """A :class:`Reader` for ``target``. :raises NotImplementedError: if none."""
        raise NotImplementedError(f"transport {self.name!r} provides no reader")

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A :class:`~outrelay.core.subscription.SubscriptionBackend` consuming
        ``spec.target`` (``capabilities.subscriptions``).

        :raises NotImplementedError: the transport offers no subscriptions.
        """
        raise NotImplementedError(f"transport {self.name!r} offers no subscriptions")

    def __repr__(self) -> str:
        return f"<{type(self).__name__} destination={self.destination!r}>"


def not_sent(key: str) -> RetryLater:
    """The result of a message held back, unsent, because an earlier one of its key failed
    (:func:`hold_after_failures` recognises it by its ``"not sent"`` prefix)."""
    return RetryLater(f"not sent: an earlier event of stream {key!r} failed")


async def send_in_key_order(
    batch: Sequence[Message], publish: Callable[[Message], Awaitable[SendResult]]
) -> list[SendResult]:
    """Send ``batch`` with ``publish(message)``: different keys concurrently,
    messages sharing a key one after another in batch order.

    Once a message of a key is not :class:`Delivered`, the later messages of
    that key are reported :class:`RetryLater` without being sent — what a
    transport declaring ``ordered_batches`` must guarantee. ``publish`` must
    return a result rather than raise.
    """
    results: list[SendResult | None] = [None] * len(batch)
    lanes: dict[str, list[int]] = {}
    for i, m in enumerate(batch):
        lanes.setdefault(m.key, []).append(i)

    async def lane(indexes: list[int]) -> None:
        for n, i in enumerate(indexes):
            results[i] = r = await publish(batch[i])
            if not isinstance(r, Delivered):
                for j in indexes[n + 1 :]:
                    results[j] = not_sent(batch[j].key)
                return

    await asyncio.gather(*(lane(ix) for ix in lanes.values()))
    return [r if r is not None else RetryLater("not sent") for r in results]


async def send_pipelined(
    batch: Sequence[Message],
    start: Callable[[Message], Awaitable[asyncio.Future[Any] | SendResult]],
    outcome: Callable[[Message, asyncio.Future[Any]], SendResult],
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
    are not started: RetryLater). Messages are started in batch order, one
    after another, and never concurrently. With ``flush``, ``start`` may only
    stage a message: ``flush()`` is awaited once after the last start and must
    write what was staged, in order (if it raises, the staged futures must
    carry the failure; the exception itself is not raised here). Once all
    are started, their futures are awaited together — at most ``timeout``
    seconds, after which the rest are cancelled — and ``outcome(m, future)``
    maps each done or cancelled future to a result.
    :func:`hold_after_failures` then applies to the outcomes.
    """
    results: list[SendResult | None] = [None] * len(batch)
    started: dict[int, asyncio.Future[Any]] = {}
    halted: set[str] = set()
    for i, m in enumerate(batch):
        if m.key in halted:
            results[i] = not_sent(m.key)
            continue
        begun = await start(m)
        if not isinstance(begun, asyncio.Future):  # a result: it was not written
            results[i] = begun
            halted.add(m.key)
            continue
        started[i] = begun
    if flush is not None:
        with contextlib.suppress(Exception):  # the staged futures carry the failure
            await flush()
    if started:
        _, late = await asyncio.wait(started.values(), timeout=timeout)
        for pending in late:
            pending.cancel()
        if late:  # let cancelled tasks finish unwinding before their outcome is read
            await asyncio.wait(late)
    for i, done in started.items():
        results[i] = outcome(batch[i], done)
    out = [r if r is not None else RetryLater("no outcome recorded") for r in results]
    return hold_after_failures(batch, out, destination=destination, log=log, fix=fix)


async def send_chained(
    batch: Sequence[Message],
    start: Callable[[Message], Awaitable[asyncio.Future[Any] | SendResult]],
    outcome: Callable[[Message, asyncio.Future[Any]], SendResult],
    *,
    timeout: float | None,
    destination: str,
    log: logging.Logger,
    flush: Callable[[], Awaitable[None]] | None = None,
) -> list[SendResult]:
    """Send ``batch`` with one unconfirmed message per key, keys in parallel, pipelined.

    The same order guarantee as :func:`send_in_key_order` — a key's next
    message is written only once the previous one is :class:`Delivered`,
    and after a failure the key's later messages are reported RetryLater
    without being sent — at close to the cost of :func:`send_pipelined`:
    no task or coroutine per message or key. The first message of every key
    is written at once (``start`` as for :func:`send_pipelined`); then, each
    time outcomes arrive, the next message of each key just confirmed is
    written, so every key keeps one message in flight and no key waits for
    another's outcome. With ``flush`` (as there), ``start`` may only stage
    and ``flush()`` writes what was staged, once per round of starts. Each
    outcome is awaited at most ``timeout`` seconds after its message was
    started; then its future is cancelled and ``outcome`` maps it.
    ``destination`` and ``log`` are accepted for symmetry with
    :func:`send_pipelined` (one message per key in flight cannot break order,
    so there is nothing to warn about).
    """
    del destination, log
    lanes: dict[str, list[int]] = {}
    for i, m in enumerate(batch):
        lanes.setdefault(m.key, []).append(i)
    results: list[SendResult | None] = [None] * len(batch)
    loop = asyncio.get_running_loop()
    arrived: list[tuple[list[int], int, asyncio.Future[Any]]] = []
    wake: asyncio.Future[None] | None = None  # the driver's, while it waits for an outcome
    #: one timer at a time, at the earliest deadline when it was set: it may ring early (that
    #: message's outcome came meanwhile), and then it is set again; never one per round
    timer: asyncio.TimerHandle | None = None

    def rouse() -> None:
        if wake is not None and not wake.done():
            wake.set_result(None)

    def arrive(lane: list[int], n: int, future: asyncio.Future[Any]) -> None:
        arrived.append((lane, n, future))
        rouse()

    def ring() -> None:
        nonlocal timer
        timer = None
        rouse()

    def halt(lane: list[int], n: int) -> None:
        for j in lane[n + 1 :]:
            results[j] = not_sent(batch[j].key)

    due = [(lane, 0) for lane in lanes.values()]  # the next message of each key to start
    deadlines: collections.deque[tuple[float, asyncio.Future[Any]]] = collections.deque()  # in start order
    waiting = 0
    try:
        while True:
            for lane, n in due:
                i = lane[n]
                begun = await start(batch[i])
                if not isinstance(begun, asyncio.Future):  # a result: it was not written
                    results[i] = begun
                    halt(lane, n)
                    continue
                waiting += 1
                begun.add_done_callback(functools.partial(arrive, lane, n))
                if timeout is not None:
                    deadlines.append((loop.time() + timeout, begun))
            if due and flush is not None:
                with contextlib.suppress(Exception):  # the staged futures carry the failure
                    await flush()
            due = []
            if not waiting:
                break
            if not arrived:
                while deadlines and deadlines[0][1].done():
                    deadlines.popleft()
                if deadlines and timer is None:
                    timer = loop.call_at(deadlines[0][0], ring)
                woken: asyncio.Future[None] = loop.create_future()
                wake = woken
                try:
                    await woken
                finally:
                    wake = None
                now = loop.time()
                while deadlines and (deadlines[0][1].done() or deadlines[0][0] <= now):
                    _, late = deadlines.popleft()
                    late.cancel()  # its outcome arrives (cancelled) like any other
            for lane, n, future in arrived:
                waiting -= 1
                i = lane[n]
                results[i] = r = outcome(batch[i], future)
                if not isinstance(r, Delivered):
                    halt(lane, n)
                elif n + 1 < len(lane):
                    due.append((lane, n + 1))
            arrived.clear()
    finally:
        if timer is not None:
            timer.cancel()
    return [r if r is not None else RetryLater("not sent") for r in results]


#: the name :func:`send_chained` had while it sent in waves (the n-th message of every key together)
send_in_waves = send_chained


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
            if not (isinstance(r, RetryLater) and r.error.startswith("not sent")):
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
