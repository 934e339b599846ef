"""The relay's memory bound: bytes of event data claimed and not yet settled.

Every destination worker asks :meth:`ByteBudget.room` before claiming and
passes the answer as the claim's ``max_bytes``, so the store never loads
more than the budget; the batch's size is taken on claim and freed when the
batch is settled (or abandoned). A claim always returns its first delivery
however large, so one event bigger than the budget still goes out — alone:
the relay holds at most ``limit`` plus one event's data.
"""

from __future__ import annotations

import asyncio

__all__ = ["ByteBudget"]


class ByteBudget:
    """``limit`` bytes shared by every destination of one relay (event loop only)."""

    def __init__(self, limit: int, batch_limit: int) -> None:
        self.limit = limit
        self.batch_limit = batch_limit
        self.used = 0
        self.closed = False
        self._changed = asyncio.Event()

    async def room(self) -> int:
        """Wait until some budget is free; return how many bytes one claim may
        load (at most ``batch_limit``). 0 once :meth:`close` was called."""
        while not self.closed and self.used >= self.limit:
            self._changed.clear()  # no await between the check and the clear: no wake-up is lost
            await self._changed.wait()
        return 0 if self.closed else min(self.batch_limit, self.limit - self.used)

    def take(self, size: int) -> None:
        self.used += size

    def free(self, size: int) -> None:
        self.used -= size
        self._changed.set()

    def close(self) -> None:
        """Wake every waiter with no room (the relay is stopping)."""
        self.closed = True
        self._changed.set()
