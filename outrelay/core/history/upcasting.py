"""Upcasters: read events written under an older version as the current one.

An event's ``event_version`` names the version of its *data* for its
``type`` ("1", "2", ...). An upcaster turns the data of one (type, version)
into the next version's; chained, they bring any stored event up to the
newest version registered for its type. They run on every read path
(history reads, replay, subscribers through :func:`upcast`), never on write:
the log keeps what was written.

Register in code::

    upcasters = default_upcasters()

    @upcasters.upcaster("order.placed", "1")
    def v1_to_v2(data):
        return {**data, "currency": "EUR"}

or from a package through the ``outrelay_add_upcasters(registry)`` hook.
Upcasters take and return the JSON value of ``data`` and must be pure (same
input, same output): replay determinism depends on it.

Event types with no upcaster pass through untouched. An event whose version
has no step towards the current one (a gap in the chain, or a version newer
than any known) raises :class:`~outrelay.EventError` naming type and versions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import orjson

from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError

__all__ = ["Upcaster", "Upcasters", "default_upcasters", "upcast"]

Upcaster = Callable[[Any], Any]


def _next_version(version: str) -> str:
    try:
        return str(int(version) + 1)
    except ValueError:
        raise EventError(
            f"upcaster from version {version!r}: not a whole number, so give to_version= explicitly"
        ) from None


class Upcasters:
    """A registry of upcasting steps per (type, from_version). Thread-safe to
    read; register before reading starts (registration is not synchronised
    with readers)."""

    def __init__(self) -> None:
        self._steps: dict[tuple[str, str], tuple[str, Upcaster]] = {}
        #: the steps from (type, version) to the type's current version, found once (cleared on register)
        self._chains: dict[tuple[str, str], tuple[tuple[str, str, Upcaster], ...]] = {}
        #: newest version per type (the target of every chain)
        self.current: dict[str, str] = {}

    def __bool__(self) -> bool:
        return bool(self._steps)

    def __len__(self) -> int:
        return len(self._steps)

    def register(
        self, type: str, from_version: str | int, fn: Upcaster, *, to_version: str | int | None = None
    ) -> None:
        """Add the step ``type`` ``from_version`` → ``to_version`` (default: the
        next whole number).

        :raises EventError: the step is registered already (two packages
            disagree), or ``to_version`` equals ``from_version``."""
        src = str(from_version)
        dst = _next_version(src) if to_version is None else str(to_version)
        if dst == src:
            raise EventError(f"upcaster for {type!r} goes from version {src} to itself")
        if (type, src) in self._steps:
            raise EventError(f"an upcaster for {type!r} from version {src} is registered twice; keep one")
        self._steps[(type, src)] = (dst, fn)
        self._chains = {}
        self.current[type] = self._end(type)

    def upcaster(
        self, type: str, from_version: str | int, *, to_version: str | int | None = None
    ) -> Callable[[Upcaster], Upcaster]:
        """Decorator form of :meth:`register`."""

        def deco(fn: Upcaster) -> Upcaster:
            self.register(type, from_version, fn, to_version=to_version)
            return fn

        return deco

    def _end(self, type: str) -> str:
        """The newest version a chain of ``type`` ends at (not the start of another step)."""
        ends = {dst for (t, _), (dst, _) in self._steps.items() if t == type}
        starts = {src for (t, src) in self._steps if t == type}
        tails = ends - starts
        return max(tails, key=_order) if tails else max(ends, key=_order)

    def upcast(self, event: Event) -> Event:
        """``event`` at its type's current version (the same object when it
        is current already or its type has no upcasters).

        :raises EventError: no path from the event's version to the current one,
            or an upcaster failed."""
        target = self.current.get(event.type)
        if target is None or event.event_version == target:
            return event
        version, raw = self.upcast_data(event.type, event.event_version, event.data, event.id)
        copy = event.with_sequence(event.sequence)  # type: ignore[arg-type]  # None is kept as None
        object.__setattr__(copy, "data", raw)
        object.__setattr__(copy, "event_version", version)
        return copy

    def upcast_data(self, type: str, version: str, data: bytes, what: str) -> tuple[str, bytes]:
        """``(current version, data)`` for ``data`` (JSON bytes) of ``type`` at
        ``version``; ``what`` names the event in errors.

        :raises EventError: no path to the current version, or an upcaster failed."""
        target = self.current.get(type)
        if target is None or version == target:
            return version, data
        try:
            value = orjson.loads(data) if data else None
        except orjson.JSONDecodeError:
            raise EventError(f"event {what} of type {type!r} needs upcasting but its data is not JSON") from None
        chain = self._chains.get((type, version)) or self._chain(type, version, target, what)
        for src, dst, fn in chain:
            try:
                value = fn(value)
            except Exception as exc:
                raise EventError(f"upcaster {type!r} {src} -> {dst} failed on event {what}: {exc}") from exc
        version = target
        try:
            return version, orjson.dumps(value)
        except TypeError as exc:
            raise EventError(f"upcaster for {type!r} to version {version} returned non-JSON data: {exc}") from exc

    def _chain(self, type: str, version: str, target: str, what: str) -> tuple[tuple[str, str, Upcaster], ...]:
        """The steps ``(from, to, fn)`` from ``version`` to ``target``, remembered
        per (type, version): a replay looks each chain up once, not per event.

        :raises EventError: a gap in the chain, or a loop."""
        steps: list[tuple[str, str, Upcaster]] = []
        seen = {version}
        start = version
        while version != target:
            step = self._steps.get((type, version))
            if step is None:
                raise EventError(
                    f"event {what} of type {type!r} is at version {version} and no upcaster goes from "
                    f"{version} towards {target}; register one with Upcasters.register({type!r}, {version!r}, fn)"
                )
            dst, fn = step
            if dst in seen:
                raise EventError(f"upcasters for {type!r} loop at version {dst}; fix the registrations")
            seen.add(dst)
            steps.append((version, dst, fn))
            version = dst
        chain = self._chains[(type, start)] = tuple(steps)
        return chain

    def upcast_all(self, events: Iterable[Event]) -> list[Event]:
        """:meth:`upcast` each event (a page at a time on the read paths)."""
        current = self.current
        return [e if current.get(e.type, e.event_version) == e.event_version else self.upcast(e) for e in events]

    def load_plugins(self, registry: Any = None) -> Upcasters:
        """Call every plugin's ``outrelay_add_upcasters(registry=self)`` hook
        (``registry``: an :class:`~outrelay.core.config.registry.Registry`, default the
        process's, :func:`~outrelay.core.config.registry.get_registry`). Returns self.

        :raises EventError: two plugins register the same step.
        :raises ConfigError: building the process's registry failed (a plugin that cannot be imported)."""
        if registry is None:
            from outrelay.core.config.registry import get_registry

            registry = get_registry()
        registry.pm.hook.outrelay_add_upcasters(registry=self)
        return self


def _order(version: str) -> tuple[int, int | str]:
    return (0, int(version)) if version.isdigit() else (1, version)


_default: Upcasters | None = None
_default_lock = threading.Lock()


def default_upcasters() -> Upcasters:
    """The process-wide registry every read path uses by default: plugins'
    upcasters are loaded into it on first use; add your own with
    ``default_upcasters().register(...)``."""
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Upcasters().load_plugins()
    return _default


def upcast(event: Event) -> Event:
    """``event`` at its type's current version, through :func:`default_upcasters`
    (what subscribers call before handing an event to a handler).

    :raises EventError: no upcaster path from the event's version."""
    up = default_upcasters()
    return up.upcast(event) if up else event
