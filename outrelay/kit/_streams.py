"""Closing an asyncio stream whose peer may never answer, for transports' socket guards.

A transport whose client library leaves connections open (failed handshakes,
cut links) closes them itself; outrelay's NATS and Service Bus transports do.
Such a connection may sit on a black hole, where a graceful close never
completes, so :func:`close_writer` gives it a bound and then aborts the
transport.
"""

from __future__ import annotations

import asyncio
import logging

__all__ = ["close_writer"]

#: waits for a connection to finish closing that outlived their caller: held so that none is collected mid-way
_closing: set[asyncio.Future[None]] = set()


async def close_writer(writer: asyncio.StreamWriter, bound: float, log: logging.Logger, what: str) -> None:
    """Close ``writer``; give it ``bound`` seconds to finish closing (flush, TLS close_notify), then abort
    its transport so the socket is released even on a black-holed link. Returns once the socket is closed
    or aborted (an aborted socket closes on the loop's next turn, which this waits for).

    The wait runs in a task of its own: in Python 3.11 ``wait_closed`` awaits the protocol's shared close
    future, so cancelling the await would cancel that future and make every later ``wait_closed`` on it
    (the client library's own ``close()`` included) raise ``CancelledError``. An error the closing
    connection reports is logged at debug level as ``what``, never raised: it is closed all the same.
    Closing an already closed writer costs nothing.

    :raises asyncio.CancelledError: the caller was cancelled (the transport is aborted first).
    """
    writer.close()
    closed = asyncio.ensure_future(writer.wait_closed())
    _closing.add(closed)
    closed.add_done_callback(lambda f: _retrieve(f, log, what))
    try:
        done, _ = await asyncio.wait({closed}, timeout=bound)
    except BaseException:  # cancelled: drop the connection at once
        writer.transport.abort()
        raise
    if not done or closed.cancelled():
        writer.transport.abort()
        await asyncio.sleep(0)  # the socket closes in connection_lost, on the loop's next turn


def _retrieve(closed: asyncio.Future[None], log: logging.Logger, what: str) -> None:
    _closing.discard(closed)
    if not closed.cancelled() and (exc := closed.exception()) is not None:
        log.debug("%s: %s", what, type(exc).__name__)
