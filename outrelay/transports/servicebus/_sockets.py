"""Closing the AMQP sockets azure-servicebus leaves open on timeout, cancel and broken links.

azure-servicebus (7.15.0 checked; its own pure-Python AMQP stack,
``azure.servicebus._pyamqp``) opens one AMQP connection per sender and
receiver. ``ServiceBusSender._open`` makes a handler (``SendClientAsync``) in
``_create_handler``. ``handler.open_async`` sets ``handler._connection`` to a
``Connection``, and its ``_transport`` (a ``SASLTransport``) holds the socket
as an asyncio ``reader``/``writer`` pair. The SDK loses that socket in two
ways:

* **The open is cancelled half-way.** ``open_async`` connects over TCP, then
  runs the SASL handshake, which waits for the peer's header with no timeout.
  On a black-holed link the open is cancelled, either by ``open_timeout`` here
  or by the SDK's own ``try_timeout`` deadline. The SDK's cleanup then calls
  ``handler.close_async()``, which returns at once because no AMQP session has
  begun yet, and afterwards forgets the handler. The connected socket is never
  closed.
* **The connection is closed after the link broke.** After a read fails (the
  connection was cut or reset), the connection stores the error.
  ``Connection.close()`` re-raises that error when it sends its Close frame,
  catches it, and sets the state to END. Its ``finally: _disconnect()`` then
  returns early because the state is already END, so ``transport.close()``
  never runs. The handler forgets the connection all the same.

In both cases the socket is closed only when the garbage collector reaches
the ``StreamWriter``. It then warns with ``ResourceWarning: unclosed ...``, or
with ``loop is closed`` once the event loop has ended, and that warning fails
whichever test happens to run at the time. Bounding the open with the SDK's
``try_timeout``/``socket_timeout`` instead of cancelling it does not help.
This was measured: the SDK cancels its own open in the same way, and
``socket_timeout`` does not bound the SASL handshake.

Closing is also slow: each handler runs a keep-alive task that sleeps 1 s
between checks (receivers always: the SDK forces a 5 s interval without
prefetch), and ``close_async`` awaits it, so every close waited up to 1 s,
failed session opens included (``NEXT_AVAILABLE_SESSION`` with no session).

:class:`Guarded` wraps one SDK sender or receiver. It replaces that object's
``_create_handler`` so that every handler it makes records its
``Connection`` when ``open_async`` ends, whether it returns, raises or is
cancelled, and whose ``close_async`` first cancels the keep-alive task (it is
being stopped anyway; only its sleep is not waited for). :meth:`Guarded.close`
closes the SDK object (bounded, quietly) and then the socket of every
recorded connection. Connections the SDK closed
itself need no work. SDK private attributes are read defensively: if a later
version renames them, the guard does nothing, and
``tests/transports/test_servicebus.py::TestSockets`` fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from outrelay.kit import close_writer

__all__ = ["Guarded"]

log = logging.getLogger("outrelay.transports.servicebus")

#: seconds the SDK's own close may take before its sockets are closed under it
CLOSE_BOUND = 5.0
#: seconds a leftover socket may take to close gracefully (flush, FIN) before it is aborted (RST)
SOCKET_BOUND = 0.5


class Guarded:
    """One SDK sender or receiver (``sdk``). Every socket it opens is closed on every path.

    Use :meth:`open` instead of ``async with``/``__aenter__``. Call :meth:`close`
    exactly where the SDK object's ``close()`` would be called. Create the guard
    before the SDK object opens anything: connections opened before that are not
    tracked.
    """

    def __init__(self, sdk: Any) -> None:
        self.sdk = sdk
        self._connections: list[Any] = []
        self._closed = False
        create = getattr(sdk, "_create_handler", None)
        if callable(create):
            sdk._create_handler = self._wrap_create(create)
        else:  # another SDK layout: nothing to hook (the regression tests say so)
            log.debug("servicebus: %s has no _create_handler; its sockets are not guarded", type(sdk).__name__)

    def _wrap_create(self, create: Any) -> Any:
        def create_handler(*args: Any, **kwargs: Any) -> None:
            create(*args, **kwargs)
            self._watch(getattr(self.sdk, "_handler", None))

        return create_handler

    def _watch(self, handler: Any) -> None:
        """Make ``handler.open_async`` record the connection it opened, however it ends, and
        ``handler.close_async`` stop the keep-alive task without waiting for its sleep."""
        open_async = getattr(handler, "open_async", None)
        close_async = getattr(handler, "close_async", None)
        if not callable(open_async) or not callable(close_async):
            return

        async def prompt_close(*args: Any, **kwargs: Any) -> Any:
            await _stop_keep_alive(handler)
            return await close_async(*args, **kwargs)

        async def tracked_open(*args: Any, **kwargs: Any) -> Any:
            try:
                return await open_async(*args, **kwargs)
            finally:
                await self._record(getattr(handler, "_connection", None))

        handler.open_async = tracked_open
        handler.close_async = prompt_close

    async def _record(self, connection: Any) -> None:
        if connection is None:
            return
        # Drop the connections the SDK closed itself (it clears the transport's writer), so
        # a long-lived sender that reconnected many times does not keep them all.
        self._connections = [c for c in self._connections if _writer(c) is not None]
        if connection not in self._connections:
            self._connections.append(connection)
        if self._closed:  # an open that ended after close(): nothing may stay open
            await _close_socket(connection)

    async def open(self, timeout: float) -> None:
        """Open the SDK object within ``timeout`` seconds.

        On any failure, including a timeout or a cancellation, everything it opened
        is closed before the error propagates.

        :raises TimeoutError: not open within ``timeout``.
        :raises Exception: the SDK's own error (the caller maps it).
        """
        try:
            await asyncio.wait_for(self.sdk.__aenter__(), timeout)
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the SDK object (bounded by :data:`CLOSE_BOUND`), then every socket it opened.

        This method is idempotent and raises nothing except ``CancelledError``.
        Even when it is cancelled, the sockets are aborted before the
        cancellation propagates.
        """
        self._closed = True
        try:
            with contextlib.suppress(Exception):  # closing must not fail; nothing is confirmed after close
                await asyncio.wait_for(self.sdk.close(), CLOSE_BOUND)
        except BaseException:
            for connection in self._connections:
                _abort(connection)
            raise
        for connection in list(self._connections):
            await _close_socket(connection)
        self._connections.clear()


async def _stop_keep_alive(handler: Any) -> None:
    """Cancel ``handler``'s keep-alive task and wait (bounded) until it ended, so that the SDK's
    ``close_async`` does not wait for the task's 1 s sleep. Nothing to do without one."""
    task = getattr(handler, "_keep_alive_thread", None)
    if not isinstance(task, asyncio.Future):
        return
    handler._keep_alive_thread = None  # close_async awaits it only while set
    if not task.done():
        task.cancel()
        await asyncio.wait({task}, timeout=CLOSE_BOUND)


def _writer(connection: Any) -> asyncio.StreamWriter | None:
    """The open ``StreamWriter`` of a pyamqp connection's transport, or None (closed, or an unknown SDK layout)."""
    transport = getattr(connection, "_transport", None)
    writer = getattr(transport, "writer", None)
    return writer if isinstance(writer, asyncio.StreamWriter) else None


def _abort(connection: Any) -> None:
    writer = _writer(connection)
    if writer is not None:
        writer.transport.abort()


async def _close_socket(connection: Any) -> None:
    """Close the socket of ``connection`` gracefully within :data:`SOCKET_BOUND`, else abort it
    (:func:`~outrelay.transports._streams.close_writer`).

    Closing a socket that is already closed costs nothing. The SDK's own state is
    left alone: the SDK object is being discarded, and a read still pending on it
    fails as after a cut connection.
    """
    writer = _writer(connection)
    if writer is not None:
        await close_writer(writer, SOCKET_BOUND, log, "servicebus: closing a leftover AMQP socket")
