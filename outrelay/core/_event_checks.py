"""Checks behind :class:`~outrelay.core.envelope.Event` validation (kept apart to keep the envelope small).

``BAD_CHAR`` matches what no text field of an event may hold: C0 controls,
DEL, C1 controls and lone surrogates. :func:`has_non_finite` finds NaN and
infinities in JSON data, which orjson would silently write as ``null``.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Any

from outrelay.core.errors import EventError

__all__ = ["BAD_CHAR", "bad_char", "has_non_finite"]

# C0, DEL, C1 and lone surrogates: they forge log lines, break headers and cannot be stored everywhere
BAD_CHAR = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


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
