"""Replay: rebuild state by folding a stream's events, in order.

``replay(store, stream, apply, initial)`` folds every event of ``stream``
(upcast to its type's current version) into a state with
``state = apply(state, event)``, in sequence order. The fold is
deterministic as long as ``apply`` is a pure function of (state, event):
the same history gives the same state on every run and every machine.

A :class:`Projection` names a fold so its state can be snapshotted:
:func:`rebuild` starts from the stored snapshot (if its ``version`` matches
the projection's) and folds only the events after it, saving a new snapshot
every ``snapshot_every`` events. A snapshot stays valid when retention has
pruned the events it covers. :func:`verify_snapshot` checks that a snapshot
gives the same state as a full replay; :func:`replay_many` rebuilds many
streams in parallel threads.

:func:`replay_counts` gives this process's totals — folds run and events
folded — for metrics (``outrelay_replays_total``, ``outrelay_replayed_events_total``).

:raises NotFoundError: the stream has no events and no snapshot (unless ``missing_ok``).
:raises EventError: an event with no upcaster path to its type's current version.
:raises StoreError: the database failed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import orjson

from outrelay.core.history.history import read_stream_pages
from outrelay.core.history.lean import LeanEvent, read_lean_pages
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import NotFoundError, UsageError
from outrelay.core.stores.base import Snapshot

if TYPE_CHECKING:
    from outrelay.core.history.upcasting import Upcasters
    from outrelay.core.stores.base import Store

__all__ = [
    "Projection",
    "ReplayCounts",
    "ReplayResult",
    "rebuild",
    "replay",
    "replay_counts",
    "replay_many",
    "verify_snapshot",
]

S = TypeVar("S")


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayCounts:
    """Replays run in this process since it started: ``folds`` (one per
    :func:`replay`/:func:`rebuild`, also those inside :func:`replay_many`
    and :func:`verify_snapshot`) and the ``events`` they folded."""

    folds: int = 0
    events: int = 0


_counts = ReplayCounts()
_counts_lock = threading.Lock()  # replay_many folds on several threads


def replay_counts() -> ReplayCounts:
    """This process's replay totals (see :class:`ReplayCounts`)."""
    return _counts


def _count(events: int) -> None:
    global _counts
    with _counts_lock:
        _counts = ReplayCounts(_counts.folds + 1, _counts.events + events)


@dataclasses.dataclass(frozen=True, slots=True)
class ReplayResult(Generic[S]):
    """The state after a fold: ``sequence`` is the last event's (0: none),
    ``events`` how many were folded now, ``from_snapshot`` the sequence the
    fold started after when it began from a snapshot."""

    stream: str
    state: S
    sequence: int
    events: int
    from_snapshot: int | None = None


class Projection(Generic[S]):
    """A named fold. Subclass it and define :meth:`initial` and :meth:`apply`;
    change ``version`` whenever ``apply`` changes meaning, so old snapshots are
    ignored. States are stored as JSON by default (override :meth:`encode`
    and :meth:`decode` for other states)."""

    #: identifies the projection's snapshots in the outbox
    name: str = ""
    #: bump when apply() changes: snapshots of another version are not used
    version: str = "1"
    #: apply() gets :class:`~outrelay.core.history.lean.LeanEvent` s (type, sequence, version and data at hand,
    #: the rest of the envelope decoded on first access): two to four times the throughput
    lean: bool = False

    def initial(self) -> S:
        raise NotImplementedError

    def apply(self, state: S, event: Any) -> S:
        """The state after ``event`` (an :class:`~outrelay.Event`, or a
        :class:`~outrelay.core.history.lean.LeanEvent` when :attr:`lean`)."""
        raise NotImplementedError

    def encode(self, state: S) -> bytes:
        return orjson.dumps(state, option=orjson.OPT_SORT_KEYS)

    def decode(self, raw: bytes) -> S:
        value: S = orjson.loads(raw)
        return value


def _pages(
    store: Store, stream: str, after: int, upcasters: Upcasters | None, lean: bool
) -> Iterable[list[Event]] | Iterable[list[LeanEvent]]:
    if lean:
        return read_lean_pages(store, stream, after=after, upcasters=upcasters)
    return read_stream_pages(store, stream, after=after, upcasters=upcasters)


def _fold(
    pages: Iterable[list[Any]], apply: Callable[[S, Any], S], state: S, on_event: Callable[[S, Any, int], None] | None
) -> tuple[S, int, int]:
    """Fold every event of ``pages`` (lists, in sequence order) into ``state``;
    returns (state, last sequence or 0, events folded)."""
    count = 0
    last = 0
    if on_event is None:  # the hot loop: nothing but apply (a list per page: no generator step per event)
        for page in pages:
            for event in page:
                state = apply(state, event)
            count += len(page)
            last = page[-1].sequence or last
        return state, last, count
    for page in pages:
        for event in page:
            state = apply(state, event)
            count += 1
            last = event.sequence or last
            on_event(state, event, count)
    return state, last, count


def replay(
    store: Store,
    stream: str,
    apply: Callable[[S, Any], S],
    initial: S,
    *,
    after: int = 0,
    upcasters: Upcasters | None = None,
    missing_ok: bool = False,
    lean: bool = False,
) -> ReplayResult[S]:
    """Fold ``stream``'s events after sequence ``after`` into ``initial``.

    ``initial`` is used as given (a mutable state is mutated by an ``apply``
    that mutates): pass a fresh one per replay. ``apply`` gets each
    :class:`~outrelay.Event`, or with ``lean`` each :class:`~outrelay.core.history.lean.LeanEvent`.

    :raises NotFoundError: no events to fold from the start of an unknown stream."""
    state, last, count = _fold(_pages(store, stream, after, upcasters, lean), apply, initial, None)
    _count(count)
    if count == 0 and after == 0 and not missing_ok:
        raise NotFoundError(f"stream {stream!r} has no events in the outbox {_where(store)}; check the name")
    return ReplayResult(stream, state, last or after, count)


def rebuild(
    store: Store,
    projection: Projection[S],
    stream: str,
    *,
    use_snapshot: bool = True,
    snapshot_every: int | None = None,
    upcasters: Upcasters | None = None,
    missing_ok: bool = False,
) -> ReplayResult[S]:
    """``projection``'s state for ``stream``: from its snapshot when there is
    one of the projection's version (and ``use_snapshot``), else from the
    first event; with ``snapshot_every``, a snapshot is saved after every
    that many events folded and at the end.

    :raises UsageError: a snapshot is wanted but the projection has no name."""
    if (use_snapshot or snapshot_every) and not projection.name:
        raise UsageError(f"{type(projection).__name__} needs a name to keep snapshots; set Projection.name")
    if snapshot_every is not None and snapshot_every < 1:
        raise UsageError(f"snapshot_every must be at least 1, got {snapshot_every}")
    snap = store.load_snapshot(projection.name, stream) if use_snapshot else None
    if snap is not None and snap.version != projection.version:
        snap = None
    state = projection.decode(snap.state) if snap else projection.initial()
    after = snap.sequence if snap else 0
    base = snap.events if snap else 0

    def save(state: S, event: Any, count: int) -> None:
        if count % snapshot_every == 0:  # type: ignore[operator]  # only set when snapshot_every is
            _save(store, projection, stream, state, event.sequence or 0, base + count)

    pages = _pages(store, stream, after, upcasters, projection.lean)
    state, last, count = _fold(pages, projection.apply, state, save if snapshot_every else None)
    _count(count)
    if count == 0 and snap is None and not missing_ok:
        raise NotFoundError(f"stream {stream!r} has no events in the outbox {_where(store)}; check the name")
    if snapshot_every and count % snapshot_every:
        _save(store, projection, stream, state, last, base + count)
    return ReplayResult(stream, state, last or after, count, snap.sequence if snap else None)


def _save(store: Store, projection: Projection[S], stream: str, state: S, seq: int, events: int) -> None:
    raw = projection.encode(state)
    store.save_snapshot(Snapshot(projection.name, stream, projection.version, seq, events, raw, time.time()))


def verify_snapshot(
    store: Store, projection: Projection[S], stream: str, *, upcasters: Upcasters | None = None
) -> bool:
    """Whether the stored snapshot, folded forward, gives exactly the state a
    full replay gives (compared as encoded bytes). False when no snapshot of
    the projection's version exists."""
    snap = store.load_snapshot(projection.name, stream) if projection.name else None
    if snap is None or snap.version != projection.version:
        return False
    full = rebuild(store, projection, stream, use_snapshot=False, upcasters=upcasters)
    warm = rebuild(store, projection, stream, use_snapshot=True, upcasters=upcasters)
    return projection.encode(full.state) == projection.encode(warm.state)


def replay_many(
    store: Store,
    projection: Projection[S],
    streams: Iterable[str],
    *,
    workers: int = 4,
    use_snapshot: bool = True,
    snapshot_every: int | None = None,
    upcasters: Upcasters | None = None,
) -> dict[str, ReplayResult[S]]:
    """:func:`rebuild` each of ``streams`` on ``workers`` threads (each stream
    is folded in order by one thread; database reads run in parallel on
    PostgreSQL). The first failure is raised after the running folds end."""
    names = list(dict.fromkeys(streams))

    def one(stream: str) -> ReplayResult[S]:
        return rebuild(
            store, projection, stream, use_snapshot=use_snapshot, snapshot_every=snapshot_every, upcasters=upcasters
        )

    with ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="outrelay-replay") as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


def _where(store: Any) -> str:
    return str(getattr(store, "where", None) or getattr(store, "path", None) or type(store).__name__)
