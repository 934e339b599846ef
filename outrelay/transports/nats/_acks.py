"""Pipelined JetStream publishing with our own ack demultiplexer.

What ``js.publish_async`` does, minus two problems of nats-py 2.16: its reply
handler loses JetStream API errors (``APIError.from_error`` raises inside
the callback, so the future only ever times out), and acks are parsed into
dataclasses at a cost that shows in profiles. Here every publish gets a
reply subject ``<inbox>.<n>`` on one wildcard subscription; the reply
resolves a future with the ack dict, or with the exception nats-py would
have raised for a synchronous ``js.publish``.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import nats.js.errors
import orjson
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

__all__ = ["AckMux"]

_NO_RESPONDERS = "503"


class AckMux:
    """Publishes with a reply inbox and resolves one future per publish.

    :meth:`start` subscribes once (nats-py re-subscribes after reconnects).
    A future that is cancelled (the caller timed out) is forgotten.
    """

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.prefix = ""
        self._counter = itertools.count()
        self._pending: dict[str, asyncio.Future[dict[str, Any]]] = {}
        self._sub: Subscription | None = None

    async def start(self) -> None:
        self.prefix = self.nc.new_inbox() + "."
        self._sub = await self.nc.subscribe(self.prefix + "*", cb=self._on_reply)

    async def publish(self, subject: str, payload: bytes, headers: dict[str, str]) -> asyncio.Future[dict[str, Any]]:
        """Send one message; the future gives the ack (``{"stream", "seq", "duplicate"?}``).

        :raises nats.errors.Error: the connection cannot take the message now.
        """
        token = str(next(self._counter))
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[token] = future
        future.add_done_callback(lambda _: self._pending.pop(token, None))
        try:
            await self.nc.publish(subject, payload, reply=self.prefix + token, headers=headers)
        except BaseException:
            future.cancel()
            raise
        return future

    async def _on_reply(self, msg: Msg) -> None:
        future = self._pending.pop(msg.subject[len(self.prefix) :], None)
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
