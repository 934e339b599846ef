"""Closing the sockets nats-py 2.x leaves open when a connection attempt fails.

nats-py (2.16.0 checked) keeps one ``TcpTransport`` per client. While the
client reconnects, ``Client._attempt_reconnect`` loops: ``_select_next_server``
opens a TCP connection (``TcpTransport.connect`` stores its ``StreamWriter``
in ``_io_writer`` and ``_bare_io_writer``), then ``_process_connect_init``
runs the INFO/CONNECT/PING handshake. When the handshake fails (the endpoint
accepts and then drops the connection, as a proxy or load balancer in front
of a dead broker does, or accepts and never answers, as a black-holed link
does), the loop reports the error to ``error_cb`` and tries again without
closing that connection, and the next ``TcpTransport.connect`` overwrites the
writer. Each failed attempt then leaves a socket to the garbage collector
(``ResourceWarning: unclosed StreamWriter``). A connection refused outright
opens nothing and leaks nothing.

:func:`close_failed_attempt`, called from the client's ``error_cb``, closes
that connection before the loop moves on. It acts only when called from the
client's reconnect task (every ``error_cb`` call there means "this attempt
failed, the next will replace its connection"), never on the connection in
use. It reads nats-py private attributes defensively: if a later nats-py
renames them it does nothing. It is harmless if nats-py closes the
connection itself, because closing a closed writer does nothing.
:func:`close_streams` does the closing. ``_client.connect`` also calls it when the
first connect fails or is cancelled mid-handshake, which nats-py cannot clean
up after. ``tests/chaos/test_nats_reconnect_leak.py`` fails if either leak
comes back.
"""

from __future__ import annotations

import asyncio
import logging

from nats.aio.client import Client

from outrelay.kit import close_writer

__all__ = ["close_failed_attempt", "close_streams"]

log = logging.getLogger("outrelay.transports.nats")

#: nats-py ``TcpTransport`` attributes holding the connection's writers: the TLS one, then the plain one
_WRITERS = ("_io_writer", "_bare_io_writer")


async def close_failed_attempt(nc: Client, bound: float) -> bool:
    """From ``nc``'s ``error_cb``: close the connection of the reconnect attempt that just failed.

    Does nothing and returns False unless the caller runs in ``nc``'s reconnect
    task (``Client._reconnection_task``). Otherwise it behaves like
    :func:`close_streams` and returns True. Raises nothing except
    ``CancelledError``, because an exception out of ``error_cb`` would end
    nats-py's reconnect loop.
    """
    task = getattr(nc, "_reconnection_task", None)
    if task is None or asyncio.current_task() is not task:
        return False
    await close_streams(nc, bound)
    return True


async def close_streams(nc: Client, bound: float) -> None:
    """Close the stream writers of ``nc``'s transport (TLS writer first, then the plain one), each given
    ``bound`` seconds to finish closing before its transport is aborted
    (:func:`~outrelay.kit.close_writer`). Errors from the closing connection are
    logged at debug level and not raised.

    :raises asyncio.CancelledError: the caller was cancelled (the transport is aborted first).
    """
    transport = getattr(nc, "_transport", None)
    writers: list[asyncio.StreamWriter] = []
    for attr in _WRITERS:
        writer = getattr(transport, attr, None)
        if isinstance(writer, asyncio.StreamWriter) and writer not in writers:
            writers.append(writer)
    for writer in writers:
        await close_writer(writer, bound, log, "nats: closing the connection of a failed attempt")
