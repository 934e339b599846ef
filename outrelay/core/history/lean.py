"""Lean events: what a fold needs, without decoding the whole envelope.

Decoding an :class:`~outrelay.Event` (its JSON envelope, time, labels,
metadata) costs more than most folds do with it. A projection can set
``Projection.lean = True`` (or pass ``lean=True`` to :func:`~outrelay.core.replay.replay`):
its ``apply`` then receives a :class:`LeanEvent`, read from the database as
``(sequence, type, version, data)`` rows and upcast like any event. Same
order, same upcasters, same state; two to four times the throughput
(benchmarks/bench_replay.py).

A :class:`LeanEvent` has every attribute name of an :class:`~outrelay.Event`
(read-only). ``stream``, ``sequence``, ``type``, ``event_version`` and
``data`` are at hand; the rest of the envelope (``id``, ``time``,
``tenant``, ``labels``…) is decoded on first access: from the stored
envelope row on SQLite, and on PostgreSQL by reading that event's page of
the stream again (one query per page of events that asks). :meth:`LeanEvent.to_event`
gives the full, upcast :class:`~outrelay.Event`. A lean event is not an
``Event`` instance: ``isinstance`` checks, ``replace()`` and
``with_sequence()`` need :meth:`~LeanEvent.to_event`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

import orjson

from outrelay.core.history.history import PAGE
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError

if TYPE_CHECKING:
    from outrelay.core.history.upcasting import Upcasters
    from outrelay.core.stores.base import Store

__all__ = ["LeanEvent", "read_lean", "read_lean_pages"]


_VERSION_KEY = b'"event_version":"'
_KEY_LEN = len(_VERSION_KEY)

#: the envelope fields a LeanEvent decodes on first access
_ENVELOPE = (
    "id",
    "source",
    "time",
    "time_text",
    "tenant",
    "correlation_id",
    "causation_id",
    "schema_version",
    "producer_version",
    "subject",
    "labels",
    "tags",
    "content_type",
    "metadata",
)


def version_of(attrs: bytes | str) -> str:
    """The ``event_version`` in a stored envelope (``Event.attributes()`` as
    orjson's compact JSON): a byte search, 10x cheaper than decoding it;
    anything unusual (an escaped quote, another writer) is decoded properly."""
    raw = attrs if type(attrs) is bytes else str(attrs).encode()
    i = raw.find(_VERSION_KEY) + _KEY_LEN
    j = raw.find(b'"', i)
    if i < _KEY_LEN or j < 0 or raw[j - 1] == 92:  # 92: a backslash
        return str(orjson.loads(raw).get("event_version") or "1")
    return raw[i:j].decode()


class _Page:
    """The envelopes of one page of a stream, read again on the first access
    to one of them (stores whose lean rows carry no envelope: PostgreSQL)."""

    __slots__ = ("_events", "_read", "after", "size", "store", "stream")

    def __init__(self, store: Store, stream: str, after: int, size: int) -> None:
        self.store, self.stream, self.after, self.size = store, stream, after, size
        self._events: dict[int, Event] = {}
        self._read = after  # envelopes are read up to this sequence

    def event(self, sequence: int) -> Event:
        """The stored (not upcast) event ``sequence`` of this page.

        :raises EventError: it was deleted (retention) since the page was read."""
        from outrelay.core.stores.base import HistoryFilter

        while sequence not in self._events and self._read < sequence:  # more than one read only if events
            got = self.store.history(HistoryFilter(stream=self.stream), after=self._read, limit=self.size)
            self._events.update((e.sequence or 0, e) for e in got)  # were committed in between (PostgreSQL)
            self._read = max(self._events, default=sequence) if len(got) == self.size else sequence
        found = self._events.get(sequence)
        if found is None:
            raise EventError(
                f"event {sequence} of stream {self.stream!r} is no longer in the outbox (pruned by retention "
                "since the fold read it); read its envelope before retention removes it"
            )
        return found


class LeanEvent:
    """One stored event as a fold sees it, cheaply: ``stream``, ``sequence``,
    ``type``, ``event_version`` (after upcasting) and ``data`` (JSON bytes,
    upcast) are plain attributes; :meth:`json` decodes ``data``; every other
    attribute of :class:`~outrelay.Event` is decoded from the stored envelope
    on first access (see the module docstring). Read-only by convention, like
    an ``Event``; equal lean events are not ``==`` (compare ``sequence``)."""

    __slots__ = ("_env", "_event", "_version", "data", "sequence", "stream", "type")

    if TYPE_CHECKING:  # decoded on first access (properties made below)
        id: str
        source: str
        time: datetime
        time_text: str
        tenant: str | None
        correlation_id: str | None
        causation_id: str | None
        schema_version: str | None
        producer_version: str | None
        subject: str | None
        labels: Mapping[str, str]
        tags: tuple[str, ...]
        content_type: str | None
        metadata: Mapping[str, str]
        _event: Event

    def __init__(
        self, stream: str, sequence: int, type: str, version: str | bytes, data: bytes, env: Any = None
    ) -> None:
        self.stream = stream
        self.sequence = sequence
        self.type = type
        self._version = version  # the version, or the envelope it is found in on first access
        self.data = data
        self._env = env  # the stored envelope (bytes/str JSON), a _Page to read it from, or None
        # _event (the full Event) is only set once asked for: one store less per event folded

    @property
    def event_version(self) -> str:
        v = self._version
        if type(v) is not str:
            v = self._version = version_of(v)
        return v

    def json(self) -> Any:
        """``data`` decoded as JSON. :raises EventError: it is not JSON."""
        try:
            return orjson.loads(self.data) if self.data else None
        except orjson.JSONDecodeError as exc:
            raise EventError(f"event {self.sequence} of stream {self.stream!r} has data that is not JSON") from exc

    def to_event(self) -> Event:
        """The full :class:`~outrelay.Event`, at the same (upcast) version and
        data; decoded once, then cached.

        :raises EventError: its envelope is gone (see :meth:`_Page.event`)."""
        try:
            return self._event
        except AttributeError:
            pass
        env, version = self._env, self._version
        if env is None and type(version) is not str:
            env = version  # the lean row carried the envelope in place of the version
        if isinstance(env, _Page):
            stored = env.event(self.sequence)
        elif env is None:
            raise EventError(f"event {self.sequence} of stream {self.stream!r} was read without its envelope")
        else:
            stored = Event.from_attributes(orjson.loads(env), self.data, self.sequence)
        event = stored.with_sequence(self.sequence)  # a copy: upcast data and version go in below
        object.__setattr__(event, "data", self.data)
        object.__setattr__(event, "event_version", self.event_version)
        self._event = event
        return event

    def __repr__(self) -> str:
        return (
            f"LeanEvent(stream={self.stream!r}, sequence={self.sequence}, type={self.type!r}, "
            f"event_version={self.event_version!r}, data=<{len(self.data)} bytes>)"
        )


def _envelope_field(name: str) -> property:
    def get(self: LeanEvent) -> Any:
        return getattr(self.to_event(), name)

    get.__name__ = name
    get.__doc__ = f"The event's ``{name}``, decoded from its stored envelope on first access."
    return property(get)


for _name in _ENVELOPE:
    setattr(LeanEvent, _name, _envelope_field(_name))
del _name


def read_lean_pages(
    store: Store, stream: str, *, after: int = 0, upcasters: Upcasters | None = None, page: int = PAGE
) -> Iterator[list[LeanEvent]]:
    """``stream``'s events after ``after`` as lists (one database page each)
    of :class:`LeanEvent`, in order, upcast to their type's current version
    (default registry unless given). Folds loop over pages: a list is cheaper
    to walk than a generator per event.

    :raises EventError: an event with no upcaster path."""
    from outrelay.core.history.upcasting import default_upcasters

    up = default_upcasters() if upcasters is None else upcasters
    current = up.current
    # per type with upcasters, its current version as it ends in a stored envelope (`2"`): an event
    # already current (the common case) then costs one find and one startswith on the envelope bytes
    tails = {t: orjson.dumps(v)[1:] for t, v in current.items()}
    tail_of, current_of = tails.get, current.get
    while True:
        rows = store.history_lean(stream, after=after, limit=page)
        lazy = _Page(store, stream, after, page)  # the envelopes of rows that came with only a version
        # one comprehension per page (cheaper per event than a loop of appends; benchmarks/README.md). A row is
        # (seq, type, version str | envelope bytes, data) (Store.history_lean); the branches, in order:
        # envelope and no upcasters for the type (the version is found only if asked), envelope at the
        # current version, version (str) at the current version, anything else (_lean_slow: upcast).
        out = [
            (
                LeanEvent(stream, seq, type_, env, data, env)
                if (tail := tail_of(type_)) is None
                else LeanEvent(stream, seq, type_, current[type_], data, env)
                if (i := env.find(_VERSION_KEY)) >= 0 and env.startswith(tail, i + _KEY_LEN)
                else _lean_slow(up, stream, seq, type_, env, data, lazy)
            )
            if type(env) is bytes
            else LeanEvent(stream, seq, type_, env, data, lazy)
            if type(env) is str and current_of(type_, env) == env
            else _lean_slow(up, stream, seq, type_, env, data, lazy)
            for seq, type_, env, data in rows
        ]
        if out:
            yield out
        if len(rows) < page:
            return
        after = rows[-1][0]


def _lean_slow(up: Upcasters, stream: str, seq: int, type_: str, env: Any, data: bytes, lazy: _Page) -> LeanEvent:
    """The :class:`LeanEvent` of a row that :func:`read_lean_pages` could not
    settle at a glance: ``env`` is its version (str; the envelope is then read
    from ``lazy`` on demand) or its stored envelope, whose version the quick
    look could not confirm as current (found properly by :func:`version_of`);
    either way the event may need upcasting.

    :raises EventError: no upcaster path from its version."""
    if type(env) is str:
        version, where = env, lazy
    else:
        version, where = version_of(env), env
    target = up.current.get(type_)
    if target is not None and version != target:
        version, data = up.upcast_data(type_, version, data, f"{stream}#{seq}")
    return LeanEvent(stream, seq, type_, version, data, where)


def read_lean(
    store: Store, stream: str, *, after: int = 0, upcasters: Upcasters | None = None, page: int = PAGE
) -> Iterator[LeanEvent]:
    """``stream``'s events after ``after`` as :class:`LeanEvent`, in order,
    upcast to their type's current version (default registry unless given).

    :raises EventError: an event with no upcaster path."""
    for batch in read_lean_pages(store, stream, after=after, upcasters=upcasters, page=page):
        yield from batch
