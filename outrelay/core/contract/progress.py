"""Per-message progress of one ``transport.send``: what a cut batch keeps.

The relay runs every send inside a :class:`Progress` (a context variable, so
the transport's signature stays ``send(batch)``). A transport takes it once
at the start of ``send`` with :func:`current_progress` and::

    progress = current_progress()
    ...
    progress.report(message, Delivered())        # once the broker confirmed it (or record(batch, results))
    if not progress.may_start(expected=latency):  # before starting a later message of a key
        ...report it NotSent and start nothing more of that key...

The kit's ordering helpers (``send_in_key_order``, ``send_chained``,
``send_pipelined``) do both, so a transport built on them reports progress
without a line of its own.

When the send is cut — ``attempt_timeout`` expired, the relay cancelled it
at shutdown, or it raised for the whole batch (a lost connection) — the
relay settles every message reported :class:`Delivered` as delivered and only
the rest is retried; nothing the broker confirmed is sent again.

"As soon as" means before ``send`` can be cut after it: a helper that learns
outcomes in callbacks may record them together when it returns or is
cancelled, as long as every outcome it learnt is recorded before the cut
reaches the relay (the kit's helpers record at their exit, normal or not).

``may_start`` is the soft side of the deadline: a message expected to take
``expected`` seconds is not started when it would end too close to the
deadline, or at all once the relay is stopping (:meth:`Progress.stop`). The
first message of a key in a send is always started, so every send makes
progress however slow the broker is.

Outside the relay (tests, the conformance suite, a direct call)
:func:`current_progress` returns a detached progress that records nothing
and never refuses a start. A report may come from any task or callback: the
object is bound once, at the start of ``send``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import Iterator, Sequence

from outrelay.core.contract.transport import Message, RetryLater, SendResult

__all__ = ["DEADLINE_MARGIN", "Progress", "current_progress", "sending"]

#: a message is started only if ``expected * DEADLINE_MARGIN`` seconds still fit before the deadline
DEADLINE_MARGIN = 1.5

_CURRENT: contextvars.ContextVar[Progress | None] = contextvars.ContextVar("outrelay_send_progress", default=None)


class Progress:
    """Outcomes of one send as they become known, and whether to start more.

    ``deadline`` is a time of the running loop's clock (``loop.time()``), or
    None for none. Not thread-safe: report from the event loop's thread.
    """

    __slots__ = ("_outcomes", "deadline", "declined", "stopped")

    def __init__(self, deadline: float | None = None) -> None:
        self._outcomes: dict[int, SendResult] = {}
        self.deadline = deadline
        #: the relay is stopping: start nothing new
        self.stopped = False
        #: ``may_start`` refused a message for the deadline or a stop
        self.declined = False

    def report(self, message: Message, result: SendResult) -> None:
        """Record ``message``'s outcome (the last report wins; Delivered is final)."""
        self._outcomes[id(message)] = result

    def record(self, batch: Sequence[Message], results: Sequence[SendResult | None]) -> None:
        """Record the outcomes known for a batch at once (``None``: not known yet)."""
        self._outcomes.update({id(m): r for m, r in zip(batch, results, strict=True) if r is not None})

    def outcome(self, message: Message) -> SendResult | None:
        """What was reported for ``message``, or None."""
        return self._outcomes.get(id(message))

    def may_start(self, expected: float = 0.0) -> bool:
        """Whether a message expected to take ``expected`` seconds should be started now.

        False once :meth:`stop` was called, or when ``expected * DEADLINE_MARGIN``
        seconds no longer fit before the deadline. Callers start the first
        message of each key regardless (see the module docstring).
        """
        if self.stopped:
            self.declined = True
            return False
        if self.deadline is None or expected <= 0.0:
            return True
        if asyncio.get_running_loop().time() + expected * DEADLINE_MARGIN < self.deadline:
            return True
        self.declined = True
        return False

    def stop(self) -> None:
        """Start nothing new (the relay is shutting down); what is in flight finishes."""
        self.stopped = True

    def cut(self, batch: Sequence[Message], failure: RetryLater | SendResult) -> list[SendResult]:
        """The results of a send that did not return: each message's reported
        outcome, else ``failure``."""
        got = self._outcomes
        return [got.get(id(m), failure) for m in batch]

    def __repr__(self) -> str:
        return f"<Progress reported={len(self._outcomes)} deadline={self.deadline} stopped={self.stopped}>"


class _Detached(Progress):
    """The progress outside a relay's send: records nothing, refuses nothing."""

    __slots__ = ()

    def report(self, message: Message, result: SendResult) -> None:
        pass

    def record(self, batch: Sequence[Message], results: Sequence[SendResult | None]) -> None:
        pass

    def may_start(self, expected: float = 0.0) -> bool:
        return True

    def stop(self) -> None:
        pass


_DETACHED = _Detached()


def current_progress() -> Progress:
    """The progress of the send running in this context (a detached one outside the relay)."""
    progress = _CURRENT.get()
    return _DETACHED if progress is None else progress


@contextlib.contextmanager
def sending(progress: Progress) -> Iterator[Progress]:
    """Run a ``transport.send`` inside ``progress`` (what the relay does; tests may too)."""
    token = _CURRENT.set(progress)
    try:
        yield progress
    finally:
        _CURRENT.reset(token)
