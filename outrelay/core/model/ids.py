"""UUIDv7 generation (RFC 9562): time-ordered, globally unique ids.

Python 3.11 has no ``uuid.uuid7``; this one keeps ids strictly increasing
within a process, even within one millisecond (12-bit counter in ``rand_a``,
re-seeded each millisecond, with the timestamp advanced on overflow).
"""

from __future__ import annotations

import os
import threading
import time
import uuid

__all__ = ["is_valid_id", "uuid7"]

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def uuid7() -> str:
    """Return a new UUIDv7 as a canonical lowercase string."""
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms > _last_ms:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x1FF  # leave headroom
        else:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
        value = (ms & ((1 << 48) - 1)) << 80
        value |= 0x7 << 76
        value |= _counter << 64
        value |= 0b10 << 62
        value |= rand_b
    return str(uuid.UUID(int=value))


def is_valid_id(value: str) -> bool:
    """An event id: 1-200 printable ASCII characters, no whitespace."""
    return 0 < len(value) <= 200 and value.isascii() and value.isprintable() and " " not in value
