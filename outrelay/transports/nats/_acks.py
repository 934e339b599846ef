"""Pipelined JetStream publishing with our own ack demultiplexer and wire encoding.

What ``js.publish_async`` does, minus two problems of nats-py 2.16: its reply
handler loses JetStream API errors (``APIError.from_error`` raises inside
the callback, so the future only ever times out), and acks are parsed into
dataclasses at a cost that shows in profiles. Here every publish gets a
reply subject ``<inbox>.<n>`` on one wildcard subscription; the reply
resolves a future with the ack dict, or with the exception nats-py would
have raised for a synchronous ``js.publish``.

The ``HPUB`` frame is built here too: nats-py's ``publish`` encodes headers
one by one (a regex match, a strip and several buffer appends per header,
~40 µs for a CloudEvents message, the largest cost of publishing), while
:func:`header_block` builds the same bytes with one join. The frame then
goes through the client's own send buffer and flusher (its private
``_send_command``/``_flush_pending``, the path ``publish`` takes), so
ordering with other traffic on the connection and reconnect handling stay
nats-py's. ``tests/transports/test_nats.py`` pins the bytes against
nats-py's encoder and fails if those private methods disappear.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable
from typing import Any

import nats.errors
import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from outrelay.kit import failing_staged

__all__ = ["AckMux", "header_block"]

log = logging.getLogger("outrelay.transports.nats")

#: pending publishes before the first sweep of those that ended without a reply (see AckMux._sweep)
_SWEEP_AT = 8192

_NO_RESPONDERS = "503"
_NEWLINES = str.maketrans({"\r": " ", "\n": " "})


def header_block(headers: dict[str, str]) -> bytes:
    """The NATS header block for ``headers``: what nats-py's ``publish`` sends.

    Names must be valid header tokens (the callers' names are fixed); values
    are stripped and CR/LF become spaces, as nats-py does, so a value cannot
    inject a header line.
    """
    values = "".join(headers.values())
    if "\r" in values or "\n" in values:
        text = "".join([f"{k}: {v.strip().translate(_NEWLINES)}\r\n" for k, v in headers.items()])
    else:
        text = "".join([f"{k}: {v.strip()}\r\n" for k, v in headers.items()])
    return b"NATS/1.0\r\n" + text.encode() + b"\r\n"


class AckMux:
    """Publishes with a reply inbox and resolves one future per publish.

    :meth:`start` subscribes once (nats-py re-subscribes after reconnects).
    A future that is cancelled (the caller timed out) is forgotten.

    Replies are handled as the client's read loop parses them (:class:`_Direct`),
    not through a subscription queue drained by a task of their own: one ack
    costs no queue put, task switch or coroutine. :meth:`stage` and
    :meth:`flush` write many messages as one command (the same bytes as
    :meth:`publish` for each, in staging order).
    """

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = ""
        self._prefix_bytes = b""
        self._counter = itertools.count()
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._subjects: dict[str, str] = {}  # token -> subject, to fail what the server refused
        self._sub: Subscription | None = None
        self._staged: list[bytes] = []
        self._staged_futures: list[asyncio.Future[dict[str, Any]]] = []
        self._sweep_at = _SWEEP_AT

    async def start(self) -> None:
        self.prefix = self.nc.new_inbox() + "."
        self._prefix_bytes = self.prefix.encode()
        # nats-py resolves a subscription's ``future`` from its read loop for every message it gets
        # (meant for one reply to an old-style request); the duck-typed one handles each reply at once
        self._sub = await self.nc.subscribe(self.prefix + "*", future=_Direct(self._on_reply))  # type: ignore[arg-type]

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[dict[str, Any]]:
        """Send one message; the future gives the ack (``{"stream", "seq", "duplicate"?}``).

        ``subject`` must already be valid (no spaces, wildcards or empty tokens).

        :raises nats.errors.Error: the connection cannot take the message now.
        """
        frame, future = self._frame(subject, payload, headers)
        try:
            await self._write(frame)
        except BaseException:
            future.cancel()
            raise
        return future

    def stage(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[dict[str, Any]]:
        """Encode one message for the next :meth:`flush` (nothing is sent yet); the future gives its ack.

        :raises nats.errors.Error: the connection cannot take the message now (nothing was staged).
        """
        frame, future = self._frame(subject, payload, headers)
        self._staged.append(frame)
        self._staged_futures.append(future)
        return future

    def stage_unacked(self, subject: str, payload: bytes, headers: dict[str, str]) -> None:
        """Encode one message without a reply subject for the next :meth:`flush`: the server sends
        nothing back for it (a member of an atomic batch before its commit, see ``_atomic.py``).

        :raises nats.errors.Error: the connection cannot take the message now (nothing was staged).
        """
        nc = self._usable()
        hdr = header_block(headers)
        if len(hdr) + len(payload) > nc.max_payload:
            raise nats.errors.MaxPayloadError
        nc.stats["out_msgs"] += 1
        nc.stats["out_bytes"] += len(payload)
        self._staged.append(
            b"HPUB %b %d %d\r\n%b%b\r\n" % (subject.encode(), len(hdr), len(hdr) + len(payload), hdr, payload)
        )

    def unstage(self) -> None:
        """Drop what was staged and not flushed; its futures are cancelled."""
        for future in self._staged_futures:
            future.cancel()
        self._staged, self._staged_futures = [], []

    async def flush(self) -> None:
        """Write what was staged, in staging order, as one command.

        If the client refuses it, every staged future fails with that error (which is raised)."""
        frames, futures = self._staged, self._staged_futures
        self._staged, self._staged_futures = [], []
        if not frames:
            return
        with failing_staged(futures):
            self._usable()
            await self._write(b"".join(frames))

    def _usable(self) -> Client:
        """The client, when it can take a message now.

        :raises nats.errors.Error: closed, or reconnecting or draining (never add a message to
            the buffer nats-py re-sends after a reconnect: see ``_transport.py``)."""
        nc = self.nc
        if nc.is_closed:
            raise nats.errors.ConnectionClosedError
        if not nc.is_connected:
            raise nats.errors.ConnectionReconnectingError
        return nc

    async def _write(self, data: bytes) -> None:
        """Hand ``data`` (whole frames) to the client's send buffer and flusher, as its ``publish`` does."""
        nc = self.nc
        await nc._send_command(data)
        if nc._flush_queue is not None and nc._flush_queue.empty():
            await nc._flush_pending()

    def _frame(
        self, subject: str, payload: bytes, headers: dict[str, str]
    ) -> tuple[bytes, asyncio.Future[dict[str, Any]]]:
        """The ``HPUB`` frame of one message and its registered ack future.

        :raises nats.errors.Error: closed, reconnecting or over ``max_payload`` (nothing registered)."""
        nc = self._usable()
        hdr = header_block(headers)
        if len(hdr) + len(payload) > nc.max_payload:
            raise nats.errors.MaxPayloadError
        token = str(next(self._counter))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if len(self._pending) >= self._sweep_at:
            self._sweep()
        self._pending[token] = future  # forgotten when its reply comes, or by _sweep once done otherwise
        self._subjects[token] = subject
        nc.stats["out_msgs"] += 1
        nc.stats["out_bytes"] += len(payload)
        frame = b"HPUB %b %b%b %d %d\r\n%b%b\r\n" % (
            subject.encode(),
            self._prefix_bytes,
            token.encode(),
            len(hdr),
            len(hdr) + len(payload),
            hdr,
            payload,
        )
        return frame, future

    def deny(self, subject: str) -> int:
        """The server refused publishing to ``subject`` (compared case-insensitively:
        nats-py lower-cases the error): fail its pending publishes with
        :class:`~outrelay.transports.nats._errors.PublishDenied`. Returns how many."""
        from outrelay.transports.nats._errors import PublishDenied

        failed = 0
        for token, subj in list(self._subjects.items()):
            future = self._pending.get(token)
            if future is not None and not future.done() and subj.lower() == subject:
                future.set_exception(PublishDenied(subj))
                failed += 1
        return failed

    def _sweep(self) -> None:
        """Forget publishes that ended without a reply (cancelled after a timeout, failed by
        :meth:`deny` or a refused write); run when the table has grown, not per message."""
        for token in [t for t, f in self._pending.items() if f.done()]:
            del self._pending[token]
            self._subjects.pop(token, None)
        self._sweep_at = max(_SWEEP_AT, 2 * len(self._pending))

    def _on_reply(self, msg: Msg) -> None:
        token = msg.subject[len(self.prefix) :]
        future = self._pending.pop(token, None)
        self._subjects.pop(token, None)
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get("Status") == _NO_RESPONDERS:
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            resp = orjson.loads(msg.data)
        except orjson.JSONDecodeError:
            future.set_exception(nats.js.errors.APIError(description="the JetStream ack is not JSON"))
            return
        error = resp.get("error") if isinstance(resp, dict) else {"description": "the JetStream ack is not an object"}
        if error is not None:
            try:
                nats.js.errors.APIError.from_error(error)  # raises the specific subclass
            except nats.js.errors.APIError as exc:
                future.set_exception(exc)
            except TypeError:  # unexpected keys in the error object
                future.set_exception(nats.js.errors.APIError(description=str(error.get("description"))))
            return
        future.set_result(resp)


class _Direct:
    """What nats-py takes for a subscription's reply future: ``set_result(msg)`` hands each
    message to ``handle`` from the client's read loop. Never done, so never skipped."""

    __slots__ = ("handle",)

    def __init__(self, handle: Callable[[Msg], None]) -> None:
        self.handle = handle

    def cancelled(self) -> bool:
        return False

    def done(self) -> bool:
        return False

    def set_result(self, msg: Msg) -> None:
        try:
            self.handle(msg)
        except Exception:  # a reply we cannot read must not end the client's read loop
            log.exception("nats: failed to handle a JetStream ack")
