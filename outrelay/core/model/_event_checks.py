"""Checks behind :class:`~outrelay.core.model.envelope.Event` validation (kept apart to keep the envelope small).

``BAD_CHAR`` matches what no text field of an event may hold: C0 controls,
DEL, C1 controls and lone surrogates. :func:`has_non_finite` finds NaN and
infinities in JSON data, which orjson would silently write as ``null``.

The field checks (``check_*``) are the one place each field's rule and error
message live: ``Event.__post_init__`` and the lean decode path
(``Event.checked``) both call them; each returns nothing (or the normalised
value) and raises :class:`~outrelay.EventError` saying what is wrong.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from outrelay.core.model.errors import EventError
from outrelay.core.model.ids import is_valid_id

__all__ = [
    "BAD_CHAR",
    "bad_char",
    "check_id",
    "check_optional",
    "check_source",
    "check_stream",
    "check_tags",
    "check_text",
    "check_time",
    "check_type",
    "has_non_finite",
]

# C0, DEL, C1 and lone surrogates: they forge log lines, break headers and cannot be stored everywhere
BAD_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/\-]{0,254}$")


def check_type(value: Any) -> None:
    """An event type: 1-255 characters of letters, digits and ``._:/-``, starting with a letter or digit."""
    if not isinstance(value, str) or not TYPE_RE.match(value):
        raise EventError(f"event type {value!r} is invalid: use 1-255 characters of letters, digits and ._:/-")


def check_stream(value: Any) -> None:
    """A stream: a non-empty string of at most 512 characters (control characters: :func:`check_text`)."""
    if not isinstance(value, str) or not value or len(value) > 512:
        raise EventError(f"event stream {value!r} is invalid: give a non-empty string of at most 512 characters")


def check_id(value: Any) -> None:
    """An event id: 1-200 printable ASCII characters without spaces."""
    if not isinstance(value, str) or not is_valid_id(value):
        raise EventError(f"event id {value!r} is invalid: give 1-200 printable ASCII characters without spaces")


def check_source(value: Any) -> None:
    """A source: a non-empty string (a URI reference; control characters: :func:`check_text`)."""
    if not isinstance(value, str) or not value:
        raise EventError("event source must be a non-empty URI-reference string")


def check_time(value: Any) -> datetime:
    """An event time: a timezone-aware datetime (returned)."""
    if not isinstance(value, datetime) or value.tzinfo is None:
        raise EventError("event time must be a timezone-aware datetime")
    return value


def check_text(name: str, value: Any) -> None:
    """No control character or lone surrogate in a text field (non-strings are checked elsewhere)."""
    # isprintable() is a fast C pre-check: False for every refused character, and rarely otherwise
    if isinstance(value, str) and not value.isprintable() and BAD_CHAR.search(value):
        raise bad_char(name, value)


def check_optional(name: str, value: Any) -> None:
    """An optional text field (tenant, correlation id, ...): None, or a non-empty clean string."""
    if value is not None:
        if not isinstance(value, str) or not value:
            raise EventError(f"event {name} must be a non-empty string or None, got {value!r}")
        check_text(name, value)


def check_tags(tags: Any) -> tuple[str, ...]:
    """Tags: a sequence (not a string) of non-empty clean strings; returned as a tuple."""
    if isinstance(tags, str) or not isinstance(tags, Iterable):
        raise EventError("event tags must be a sequence of strings")
    out = tuple(tags)
    if not all(isinstance(t, str) and t for t in out):
        raise EventError("event tags must be non-empty strings")
    for t in out:
        check_text(f"tag {t!r}", t)
    return out


def bad_char(name: str, value: str) -> EventError:
    """The error for a control character or lone surrogate in field ``name``."""
    m = BAD_CHAR.search(value)
    where = m.start() if m else 0
    char = f"U+{ord(value[where]):04X}" if m else "?"
    return EventError(
        f"event {name} contains {char} at index {where}: control characters and lone surrogates are not allowed"
    )


_SCALARS = (str, int, bool, type(None))


def has_non_finite(data: Any, raw: bytes) -> bool:
    """True if ``data`` holds a NaN or infinite float (which orjson writes as ``null``).

    Small payloads are walked directly (a few hundred ns); past 64 values, or on
    a type other than the JSON builtins, the encoded bytes are scanned for a
    ``null`` first, so a large payload costs one C-speed scan, not a Python walk.
    """
    stack = [data]
    budget = 64
    while stack:
        value = stack.pop()
        kind = type(value)
        if kind is float:
            if not math.isfinite(value):
                return True
        elif kind is dict:
            stack.extend(value.values())
        elif kind is list or kind is tuple:
            stack.extend(value)
        elif kind not in _SCALARS:
            break
        budget -= 1
        if budget < 0:
            break
    else:
        return False
    return b"null" in raw and _non_finite(data)


def _non_finite(value: Any, depth: int = 0) -> bool:
    """True if ``value`` (JSON-like containers, dataclasses) holds a NaN or infinite float."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if depth > 256:  # orjson refuses deeper nesting anyway
        return False
    if isinstance(value, Mapping):
        return any(_non_finite(v, depth + 1) for v in value.values())
    if isinstance(value, list | tuple | set | frozenset):
        return any(_non_finite(v, depth + 1) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return any(_non_finite(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    return False
