"""Backoff computation: exponential, full jitter, Retry-After honoured."""

from __future__ import annotations

import random

from outrelay.core.config.config import RetryPolicy

__all__ = ["backoff_delay"]


def backoff_delay(
    policy: RetryPolicy, attempt: int, retry_after: float | None = None, rng: random.Random | None = None
) -> float:
    """Seconds to wait before attempt ``attempt + 1`` (``attempt`` counts from 1).

    ``initial_delay * multiplier**(attempt-1)`` capped at ``max_delay``, times a
    random factor in ``[1 - jitter, 1]``; never less than ``retry_after``
    (itself capped at ``max_retry_after``).
    """
    r = rng or random
    base = min(policy.max_delay, policy.initial_delay * policy.multiplier ** max(0, attempt - 1))
    delay = base * (1.0 - policy.jitter * r.random())
    if retry_after is not None and retry_after > 0:
        delay = max(delay, min(retry_after, policy.max_retry_after))
    return delay
