"""Per-partition bookkeeping of a Kafka group member: what was handed out, what is acked, what to commit.

Acks come back out of order across streams that share a partition, but a
Kafka commit is one offset per partition ("everything before this is
done"). :class:`PartitionTrack` therefore commits only the contiguous
handled prefix: the offset after the last record whose predecessors (as
handed out) are all acked.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["PartitionTrack"]


class PartitionTrack:
    """Offsets of one assigned partition, for one assignment (a rebalance makes a new track).

    ``commit_to`` is the next offset to read after the handled prefix (what
    to commit), ``None`` until known; ``committed`` what was last committed.
    """

    __slots__ = ("_acked", "_pending", "commit_to", "committed", "live")

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._acked: set[int] = set()
        self.commit_to: int | None = None
        self.committed: int | None = None
        #: False once the partition was revoked or the member stopped: late acks are ignored
        self.live = True

    def hand_all(self, offsets: Iterable[int]) -> None:
        """Record that the records at ``offsets`` were handed out (a fetched batch; offsets
        arrive in increasing order, within and across calls)."""
        self._pending.extend(offsets)

    def ack(self, offset: int) -> bool:
        """Mark ``offset`` handled; True when it was outstanding (a repeated or stale ack is ignored)."""
        pending = self._pending
        if not self.live or not pending:
            return False
        if offset == pending[0] and not self._acked:  # the oldest, nothing acked past it: the prefix grows by one
            pending.popleft()
            self.commit_to = offset + 1
            return True
        if offset in self._acked or offset < pending[0]:
            return False
        self._acked.add(offset)
        while self._pending and self._pending[0] in self._acked:
            done = self._pending.popleft()
            self._acked.discard(done)
            self.commit_to = done + 1
        return True

    @property
    def outstanding(self) -> int:
        """Records handed out and not acked yet."""
        return len(self._pending) - len(self._acked)

    @property
    def dirty(self) -> bool:
        """There is a handled prefix (or a resolved start position) not committed yet."""
        return self.commit_to is not None and self.commit_to != self.committed
