"""Lean construction of frozen, slotted dataclasses (such as :class:`~outrelay.Event`) on hot paths.

A frozen dataclass refuses attribute stores, so a lean constructor that skips
``__init__`` has to fill each slot through its descriptor
(``Event.__dict__[name].__set__(obj, value)``): a method call per field. A
*draft* class has the same slots and no ``__setattr__`` of its own, so its
instance is filled with plain attribute stores; :func:`drafting`'s ``seal``
then turns it into the frozen class by ``__class__`` assignment, which CPython
allows between classes whose slots are the same. Measured here for an
Event's 19 slots: 0.6 µs instead of 2.9 µs per object.

Where an interpreter refuses that assignment, ``seal`` copies the slots into a
new object through their descriptors instead (the old cost, same result).

Contract for callers: set every slot of the draft before sealing it (a slot
left unset raises ``AttributeError`` when read, as on any slotted object) and
only with values the frozen class would accept — nothing is validated here.
A draft is sealed once and not touched afterwards.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["drafting"]

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
