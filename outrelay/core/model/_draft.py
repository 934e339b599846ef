"""Lean construction of frozen, slotted dataclasses (such as :class:`~outrelay.Event`) on hot paths.

A frozen dataclass refuses attribute stores, so a lean constructor that skips
``__init__`` has to fill each slot through its descriptor
(``Event.__dict__[name].__set__(obj, value)``): a method call per field. A
*draft* class has the same slots and no ``__setattr__`` of its own, so its
instance is filled with plain attribute stores; :func:`drafting`'s ``seal``
then turns it into the frozen class by ``__class__`` assignment, which CPython
allows between classes whose slots are the same: several times cheaper per
object (figures in benchmarks/README.md, "Why the code is as it is").

Where an interpreter refuses that assignment, ``seal`` copies the slots into a
new object through their descriptors instead (the old cost, same result).

Contract for callers: set every slot of the draft before sealing it (a slot
left unset raises ``AttributeError`` when read, as on any slotted object) and
only with values the frozen class would accept — nothing is validated here.
A draft is sealed once and not touched afterwards.

Two generated helpers build on drafts, for callers that set every field at
once: :func:`copier` (a copy of an object with some fields changed: payload
sealing, claim checks, tracing) and :func:`builder` (a new object from all its
field values: a consumer's per-record :class:`~outrelay.core.contract.reading.Received`).
Their code is generated, as dataclasses generates ``__init__``: one plain
store per field into a draft, no loop (a loop over the fields costs more), and
no validation (``dataclasses.replace`` and the
constructor validate, and are slower still). They follow the class's fields
as they are, whatever they become.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["builder", "copier", "drafting"]

T = TypeVar("T")


def drafting(cls: type[T]) -> tuple[Callable[[], Any], Callable[[Any], T]]:
    """``(new, seal)`` for the slotted class ``cls``: ``new()`` returns an empty draft,
    ``seal(draft)`` returns it as a ``cls`` instance (see the module docstring).

    :raises TypeError: ``cls`` has no ``__slots__`` (only slotted classes have drafts).
    """
    slots = tuple(getattr(cls, "__slots__", ()))
    if not slots or "__dict__" in slots:
        raise TypeError(f"{cls.__name__} is not a slotted class: it has no draft")
    draft: type = type(f"_{cls.__name__}Draft", (), {"__slots__": slots, "__module__": cls.__module__})
    new: Callable[[], Any] = functools.partial(object.__new__, draft)

    def by_class(obj: Any) -> T:
        obj.__class__ = cls
        return obj  # type: ignore[no-any-return]

    try:
        by_class(new())
    except TypeError:  # an interpreter without __class__ assignment between these layouts
        return new, _copier(cls, slots)
    return new, by_class


def _copier(cls: type[T], slots: tuple[str, ...]) -> Callable[[Any], T]:
    """``seal`` by copying each slot into a new ``cls`` object through its descriptor."""
    setters = tuple((cls.__dict__[name].__set__, name) for name in slots)
    new_object = object.__new__

    def by_copy(obj: Any) -> T:
        out = new_object(cls)
        for put, name in setters:
            put(out, getattr(obj, name))
        return out

    return by_copy


def copier(cls: type[Any], *changed: str) -> Callable[..., Any]:
    """``copy(obj, *values)``: a new ``cls`` with the fields ``changed`` set to
    ``values`` (in that order) and every other field taken from ``obj``.

    Values are stored as given: pass read-only ones (a ``MappingProxyType``).

    :raises TypeError: ``cls`` has no field of one of those names, or is not a slotted class.
    """
    fields = _fields(cls)
    unknown = set(changed) - set(fields)
    if unknown:
        raise TypeError(f"{cls.__name__} has no field(s) {sorted(unknown)}")
    values = {name: f"v_{name}" if name in changed else f"obj.{name}" for name in fields}
    return _generate(cls, ["obj", *(f"v_{name}" for name in changed)], values)


def builder(cls: type[T]) -> Callable[..., T]:
    """``build(*values)``: a new ``cls`` with its fields set to ``values``, in the order of
    ``dataclasses.fields(cls)`` (all of them, positional), as given and unvalidated.

    :raises TypeError: ``cls`` is not a slotted class.
    """
    fields = _fields(cls)
    return _generate(cls, [f"v_{name}" for name in fields], {name: f"v_{name}" for name in fields})


def _fields(cls: type[Any]) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _generate(cls: type[Any], params: list[str], values: dict[str, str]) -> Callable[..., Any]:
    """A function of ``params`` that fills a draft of ``cls`` with ``slot = expression``
    (``values``, every slot of ``cls``) and seals it."""
    new, seal = drafting(cls)
    body = "".join(f"    d.{name} = {expr}\n" for name, expr in values.items())
    ns: dict[str, Any] = {"_new": new, "_seal": seal}
    # the source holds only the class's own field names (identifiers)
    exec(f"def make({', '.join(params)}):\n    d = _new()\n{body}    return _seal(d)\n", ns)
    fn: Callable[..., Any] = ns["make"]
    return fn
