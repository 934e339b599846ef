"""The store contract: what the relay asks of an outbox database.

Data model (every store keeps the same facts):

* **events** — the append-only log; ``sequence`` per store; ``routed`` until
  the relay has fanned the event out to destinations.
* **deliveries** — pending work: one row per (event, destination) not yet
  delivered or dead-lettered, ordered per (destination, stream) by its id.
  A delivered row is deleted, so claiming never reads history.
* **lanes** — one row per (destination, stream) with pending deliveries.
  ``due_at`` is when the lane may be claimed next: claiming leases it by
  pushing ``due_at`` to now + lease (a crashed relay's lanes become
  claimable when the lease runs out; a live relay renews the leases of its
  batches in flight), settling sets it to now (more work)
  or to a retry time. ``parked`` lanes wait for an operator. Only one
  holder works a lane at a time, which is what keeps per-stream order.
* **dead_letters** — failed deliveries with event, destination, reason,
  attempts and timestamps; ``state`` is ``dead``, ``parked`` or ``replayed``.
* **destination state** — disabled flag, last error, delivered counter.

The contract comes in the roles that use it: :class:`AppendStore` (the
application), :class:`RelayStore` (the relay's claim loop), :class:`OperatorStore`
(status, dead letters, replay) and :class:`HistoryStore` (reading the log back,
snapshots, retention); :class:`Store` is all four.

All methods are synchronous and may be called from one worker thread; the
relay wraps them (``max_workers`` threads, 1 for SQLite). Times are Unix
seconds (float). Every database failure is raised as
:class:`~outrelay.StoreError`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Literal, TypeVar

from outrelay.core.model.envelope import Event
from outrelay.core.model.history_filter import HistoryFilter, matches

__all__ = [
    "AppendStore",
    "Attempt",
    "Claimed",
    "DeadLetter",
    "DestinationStatus",
    "HistoryFilter",
    "HistoryStore",
    "InlineRefused",
    "OperatorStore",
    "RelayStore",
    "SettleKind",
    "Settlement",
    "Snapshot",
    "Store",
    "inline_call",
    "running_inline",
]

T = TypeVar("T")

SettleKind = Literal["delivered", "retry", "dead", "park", "hold"]


@dataclasses.dataclass(frozen=True, slots=True)
class Claimed:
    """A delivery handed to the relay: the event and its prior attempts."""

    delivery_id: int
    event: Event
    attempts: int
    first_attempt_at: float | None


#: one row of the delivery-attempt log (:mod:`outrelay.core.relay.attempts`), in column order: ``at`` (the attempt's
#: start, Unix seconds), ``event_id``, ``event_seq``, ``destination``, ``stream``, ``attempt`` (its number),
#: ``outcome`` (one of :data:`outrelay.core.relay.attempts.OUTCOMES`), ``latency`` (seconds), ``error`` and
#: ``detail`` (JSON text; both "" when there are none). A plain tuple: one is built per event attempted.
Attempt = tuple[float, str, int, str, str, int, str, float, str, str]


@dataclasses.dataclass(frozen=True, slots=True)
class Settlement:
    """The outcome of one claimed delivery.

    ``delivered`` deletes it; ``retry`` records the attempt and makes the
    lane due at ``due_at``; ``dead`` moves it to the dead letters and the
    stream continues; ``park`` records a dead letter in state ``parked`` and
    stops the lane; ``hold`` leaves it pending untouched (not attempted).
    """

    delivery_id: int
    stream: str
    kind: SettleKind
    attempts: int = 0
    due_at: float = 0.0
    error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class DestinationStatus:
    destination: str
    pending: int
    in_retry: int
    dead_lettered: int
    parked_streams: int
    delivered: int
    oldest_pending_age: float | None
    last_error: str | None
    last_error_at: float | None
    disabled: str | None

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_counts(
        cls,
        destination: str,
        pending: int,
        in_retry: int,
        oldest_created_at: float | None,
        dead_lettered: int,
        parked_streams: int,
        totals: Sequence[Any] | None,
        now: float,
    ) -> DestinationStatus:
        """Assemble a status from a store's counts; ``totals`` is the destination's
        ``(delivered, last_error, last_error_at, disabled)`` row, None if it has none yet."""
        delivered, err, err_at, disabled = totals if totals else (0, None, None, None)
        age = None if oldest_created_at is None else max(0.0, now - oldest_created_at)
        return cls(destination, pending, in_retry, dead_lettered, parked_streams, delivered, age, err, err_at, disabled)


@dataclasses.dataclass(frozen=True, slots=True)
class DeadLetter:
    id: int
    event: Event
    destination: str
    reason: str
    attempts: int
    first_attempt_at: float | None
    failed_at: float
    state: str

    def summary(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "event_id": self.event.id,
            "type": self.event.type,
            "stream": self.event.stream,
            "tenant": self.event.tenant,
            "destination": self.destination,
            "reason": self.reason,
            "attempts": self.attempts,
            "first_attempt_at": self.first_attempt_at,
            "failed_at": self.failed_at,
            "state": self.state,
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Snapshot:
    """A projection's state after folding ``stream`` up to ``sequence``."""

    name: str
    stream: str
    version: str
    sequence: int
    events: int
    state: bytes
    created_at: float


class AppendStore(ABC):
    """The application's side of an outbox database: append events, and tell a relay
    in another process that new ones were committed."""

    url: str

    @abstractmethod
    def append(self, events: Sequence[Event], conn: Any = None) -> list[Event]:
        """Insert ``events``; in ``conn``'s open transaction if given (the
        caller commits), else in a transaction of its own. Returns the events
        with ``sequence`` set. Never talks to a broker.

        :raises EventError: duplicate event id.
        """

    async def aappend(self, events: Sequence[Event], conn: Any = None) -> list[Event]:
        """:meth:`append` for asyncio code: in ``conn``'s open transaction if
        given (an async connection of the store's driver), else in a worker
        thread. Stores without async drivers refuse ``conn``.

        :raises EventError: duplicate event id. :raises StoreError: ``conn`` not supported.
        """
        if conn is not None:
            from outrelay.core.model.errors import StoreError

            raise StoreError(f"{type(self).__name__} takes no async connection; append in a sync one with append()")
        return await asyncio.to_thread(self.append, events)

    #: whether :meth:`listen` takes ``loop=`` (a store of this package; one of a plugin may not)
    listens_in_loop: bool = False

    def listen(self, callback: Callable[[str], None]) -> Callable[[], None]:
        """Call ``callback(what)`` from any thread when another process has
        committed an append (``"appended"``) or routed events (``"routed"``),
        so a relay wakes before its next poll. Returns a function that stops
        listening. Default: no notifications (relays poll).

        A store whose :attr:`listens_in_loop` is true also takes ``loop=`` (the caller's running
        event loop): it may then watch in that loop and call ``callback`` in the loop's thread
        (the stop function must then be called there too)."""
        return lambda: None


class InlineRefused(Exception):
    """:meth:`RelayStore.call_inline` would have had to wait; nothing was done."""


_inline = threading.local()  # .on: this thread runs a RelayStore.call_inline


@contextmanager
def inline_call() -> Iterator[None]:
    """For a store's :meth:`RelayStore.call_inline`: the calling thread runs an inline call for the
    ``with`` block, so the store's waits (a locked database, a busy pool) raise :class:`InlineRefused`
    instead (they ask :func:`running_inline`)."""
    _inline.on = True
    try:
        yield
    finally:
        _inline.on = False


def running_inline() -> bool:
    """Whether the calling thread is inside :func:`inline_call` (it must not wait: refuse instead)."""
    return bool(getattr(_inline, "on", False))


class RelayStore(ABC):
    """What a relay asks of an outbox database: route, claim, renew, settle, and the
    waits between them (see the module docstring for the data model)."""

    #: threads the relay may use to call this store concurrently
    max_workers: int = 1
    #: whether several relay processes may share this store
    multi_relay: bool = False
    #: names of this store's methods a relay may run through :meth:`call_inline`
    inline_methods: frozenset[str] = frozenset()
    #: seconds: a call of :attr:`inline_methods` that took longer runs in the store's thread next time
    #: (until one there is quicker): the relay's loop is never held much longer by one call, and a
    #: draining relay keeps overlapping its calls and sends
    inline_seconds: float = 0.001

    def call_inline(self, call: Callable[[], T]) -> T:
        """Run ``call`` (one of :attr:`inline_methods`, bound and with its arguments) in the caller's
        thread — the relay's event loop — if it can run without waiting: a call that would wait (for a
        lock, or another writer) raises :class:`InlineRefused` before it changed anything, and the relay
        runs it in the store's thread instead. Saves two thread hand-offs per call where calls are
        short (a relay at a trickle). Default: always refused."""
        raise InlineRefused(f"{type(self).__name__} runs no call inline")

    @abstractmethod
    def acquire_relay(self, owner: str) -> None:
        """Register a relay process. Stores that serve one relay raise
        :class:`~outrelay.StoreLockedError` when another holds it, and release
        the leases a crashed predecessor left."""

    @abstractmethod
    def release_relay(self, owner: str) -> None:
        """Release leases held by ``owner`` and the relay registration."""

    @abstractmethod
    def route(self, router: Callable[[Event], Sequence[str]], limit: int, now: float) -> int:
        """Fan out up to ``limit`` unrouted events (in sequence order) into
        deliveries for the destinations ``router`` returns. Returns how many
        events were routed. Never skips an event committed late. When
        ``router.static_destinations`` is set (not None), every event goes to
        exactly those and the store need not decode events. Otherwise ``router``
        is called with each event's envelope and empty ``data``: routing reads
        no payload (memory stays bounded whatever the backlog's sizes)."""

    @abstractmethod
    def claim(
        self,
        destination: str,
        *,
        limit: int,
        per_lane: int,
        owner: str,
        lease_seconds: float,
        now: float,
        max_bytes: int | None = None,
    ) -> list[Claimed]:
        """Lease due lanes of ``destination`` (earliest due first) and return
        up to ``per_lane`` deliveries of each, in order, ``limit`` in all.
        Only lanes that contributed a delivery are leased. Lanes ``owner``
        already holds are never claimed again, even after their ``due_at``
        passed (their batch is still in flight). With ``max_bytes``, the
        claim stops before the event data it returns would exceed it (the
        first delivery always comes, however large), and data beyond that is
        never read from the database."""

    def renew_leases(self, owner: str, lease_seconds: float, now: float) -> int:
        """Extend every lane lease ``owner`` holds to ``now + lease_seconds``
        (the relay calls it while batches are in flight, so a slow send never
        lets its lanes be claimed again). Returns the number of lanes renewed.
        Default: nothing renewed (a store without it relies on long leases)."""
        return 0

    @abstractmethod
    def settle(
        self,
        destination: str,
        owner: str,
        settlements: Sequence[Settlement],
        now: float,
        attempts: Sequence[Attempt] = (),
    ) -> None:
        """Apply outcomes in one transaction and release the lanes (see
        :class:`Settlement`). Lanes no longer leased by ``owner`` are left alone.
        ``attempts``: rows of the delivery-attempt log to insert in the same transaction
        (every one, whoever holds the lanes now: the attempts happened); the relay passes
        them only to a store that keeps the log (:class:`outrelay.core.relay.attempts.AttemptStore`)."""

    @abstractmethod
    def next_due(self, destination: str) -> float | None:
        """Earliest ``due_at`` of an unparked lane of ``destination``, or None."""

    def quiet_until(self, destination: str, ttl: float) -> float:
        """A time (``time.time()``) before which a claim of ``destination`` by this
        relay would find nothing, as far as the store already knows without
        asking the database; 0.0 when it does not know (the default). Called
        from the event loop: it must not block. Knowledge older than ``ttl``
        seconds is not trusted (work other processes make due is not always
        announced). A relay still claims at once when woken by new appends or
        routing; the store forgets what it knew on those. A settled batch wakes a
        waiting relay only when it lowered this below the wait's end (a settle that
        keeps a lane pending must lower it, else the relay sleeps past it), or when
        the store does not know (``math.inf`` as ``ttl`` asks for the knowledge at
        any age)."""
        return 0.0

    def leased_elsewhere(self, destination: str, owner: str, now: float) -> float | None:
        """Latest lease expiry (``due_at``) of ``destination``'s lanes leased
        by a relay other than ``owner`` and not expired at ``now``, or None.
        A draining relay waits for these (another relay, maybe a crashed one,
        holds that work). Default: None (a store serving one relay frees a
        predecessor's leases when it is acquired)."""
        return None

    @abstractmethod
    def unrouted(self) -> int:
        """Events not routed yet."""


class OperatorStore(ABC):
    """What operators ask (``outrelay status``, ``dlq``, ``enable``, ``replay``): state per
    destination, dead letters, and sending history again."""

    @abstractmethod
    def status(self, destinations: Sequence[str], now: float) -> list[DestinationStatus]: ...

    @abstractmethod
    def record_error(self, destination: str, error: str | None, now: float) -> None: ...

    @abstractmethod
    def set_disabled(self, destination: str, reason: str | None, now: float) -> None:
        """Disable (``reason`` given) or re-enable (``None``) a destination."""

    @abstractmethod
    def disabled(self, destination: str) -> str | None: ...

    @abstractmethod
    def dead_letters(
        self, *, destination: str | None = None, states: Sequence[str] = ("dead", "parked"), limit: int = 100
    ) -> list[DeadLetter]: ...

    @abstractmethod
    def dead_letter(self, dl_id: int) -> DeadLetter:
        """:raises NotFoundError: no such dead letter."""

    @abstractmethod
    def replay_dead(self, ids: Sequence[int] | None, *, destination: str | None, now: float) -> int:
        """Queue dead letters again (all matching when ``ids`` is None);
        a parked lane is unparked and its head retried. Returns the count."""

    @abstractmethod
    def purge_dead(self, ids: Sequence[int] | None, *, destination: str | None) -> int:
        """Delete dead letters; purging a parked one drops that delivery and
        unparks its lane. Returns the count."""

    @abstractmethod
    def replay_stream(self, destination: str, *, stream: str | None, after: int, now: float) -> int:
        """Queue history (``sequence > after``, one stream or all) to
        ``destination`` again. Returns the count queued."""

    def replay_events(self, destination: str, sequences: Sequence[int], *, now: float) -> int:
        """Queue the routed events among ``sequences`` to ``destination`` again,
        in sequence order, in one transaction (``outrelay replay`` pages
        through a filtered history with it). Unrouted or unknown sequences are
        skipped. Returns the count queued.

        :raises StoreError: the store cannot (the default)."""
        from outrelay.core.model.errors import StoreError

        raise StoreError(f"{type(self).__name__} cannot replay selected events; use the SQLite or PostgreSQL outbox")


class HistoryStore(ABC):
    """Reading the log back (history, replay, projections' snapshots) and its retention."""

    @abstractmethod
    def events(self, *, stream: str | None = None, after: int = 0, limit: int = 1000) -> list[Event]:
        """Read the log in sequence order (history, for replay and tools)."""

    def history(self, where: HistoryFilter, *, after: int = 0, limit: int = 1000) -> list[Event]:
        """One page of the log: events matching ``where`` with ``sequence >
        after``, in sequence order, at most ``limit``. Callers page by passing
        the last sequence back (keyset pagination: each page costs the same
        however long the log is). Default: filters :meth:`events` pages in
        Python (a store should push the filter into its query)."""
        out: list[Event] = []
        while len(out) < limit:
            page = self.events(stream=where.stream, after=after, limit=limit)
            if not page:
                break
            out += [e for e in page if matches(where, e)]
            after = page[-1].sequence or after
        return out[:limit]

    def history_lean(self, stream: str, *, after: int = 0, limit: int = 1000) -> list[tuple[int, str, Any, bytes]]:
        """One page of ``stream`` as ``(sequence, type, version, data)`` rows,
        in sequence order: what a fold needs, without decoding the rest of
        each envelope (see :mod:`outrelay.core.history.lean`). ``version`` is the
        event_version (str), or the stored envelope JSON (bytes) for the
        reader to find it in when it needs it. Default: from :meth:`history`."""
        page = self.history(HistoryFilter(stream=stream), after=after, limit=limit)
        return [(e.sequence or 0, e.type, e.event_version, e.data) for e in page]

    def save_snapshot(self, snapshot: Snapshot) -> None:
        """Store ``snapshot``, replacing the one kept for (name, stream).

        :raises StoreError: the store keeps no snapshots (the default)."""
        from outrelay.core.model.errors import StoreError

        raise StoreError(f"{type(self).__name__} keeps no snapshots; use the SQLite or PostgreSQL outbox")

    def load_snapshot(self, name: str, stream: str) -> Snapshot | None:
        """The snapshot kept for (``name``, ``stream``), or None. Default: None."""
        return None

    @abstractmethod
    def prune(
        self,
        older_than: float | None,
        *,
        keep_last: int | None = None,
        batch: int = 1000,
        max_batches: int | None = None,
    ) -> int:
        """Delete delivered history: routed events that no delivery or dead
        letter refers to, and that are older than ``older_than`` (None: any
        age) or, with ``keep_last``, not among the last ``keep_last`` events
        of their stream. Both given: an event goes when either says so.
        Neither: nothing is deleted. Deletes in transactions of at most
        ``batch`` rows so appends and deliveries are never held up for long,
        at most ``max_batches`` of them (None: until nothing is left).
        Returns the count. An undelivered event is never deleted."""


class Store(AppendStore, RelayStore, OperatorStore, HistoryStore):
    """An outbox database: every role above. See the module docstring for the data model.
    Code that needs one role only should take that role's type."""

    @abstractmethod
    def close(self) -> None: ...
