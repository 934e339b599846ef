"""One call per message, nothing awaited: the ordering rule for sinks that answer at once.

An in-process broker or a local file learns each message's outcome the moment
it writes it, so it needs neither tasks nor futures, only the order rule::

    results = send_each(batch, self._store_one, progress=progress)
    progress.record(batch, results)

:func:`send_each` is synchronous so that it may also run in a worker thread
(``asyncio.to_thread``); it therefore does not record the outcomes itself (a
:class:`~outrelay.core.contract.progress.Progress` is reported from the event loop's
thread): the caller records them as soon as it has them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from outrelay.core.contract.progress import Progress
from outrelay.core.contract.transport import Delivered, Message, SendResult
from outrelay.kit._ordering import deferred, not_sent

__all__ = ["send_each"]


def send_each(
    batch: Sequence[Message],
    publish: Callable[[Message], SendResult],
    *,
    progress: Progress,
    halt: Callable[[], bool] | None = None,
) -> list[SendResult]:
    """``publish(message)`` for each message of ``batch`` in batch order; one result per message.

    After a key's first result that is not :class:`Delivered`, the later
    messages of that key are :func:`not_sent` without a call. Once the relay
    is stopping (``progress.stopped``) or ``halt()`` is true (the send was
    cut: a thread's caller sets it), no further message is started: the rest
    are :func:`deferred`. ``publish`` must return a result, not raise.
    """
    results: list[SendResult] = []
    failed: set[str] = set()
    for m in batch:
        if m.key in failed:
            results.append(not_sent(m.key))
        elif progress.stopped or (halt is not None and halt()):
            results.append(deferred(progress))
        else:
            r = publish(m)
            if not isinstance(r, Delivered):
                failed.add(m.key)
            results.append(r)
    return results
