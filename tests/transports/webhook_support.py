"""Helpers shared by the webhook tests (a real receiver on loopback, no mocks)."""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from outrelay import Event, Message
from outrelay.transports.webhook._transport import WebhookConfig, WebhookTransport

#: a Standard Webhooks secret (whsec_ + base64 of 32 bytes)
SECRET = "whsec_" + base64.b64encode(b"outrelay-webhook-test-secret-32b").decode()
#: a second secret, for rotation
OTHER_SECRET = "whsec_" + base64.b64encode(b"outrelay-webhook-rotated-key-32b").decode()


def make_transport(url: str, **options: Any) -> WebhookTransport:
    """A webhook transport to ``url`` signing with :data:`SECRET`, loopback allowed."""
    options.setdefault("secret", SECRET)
    options.setdefault("allow_private_network", True)
    return WebhookTransport(WebhookConfig(url=url, **options), destination="hooks")


def messages(transport: WebhookTransport, events: Sequence[Event]) -> list[Message]:
    """One :class:`Message` per event, targeted and keyed as the relay would."""
    return [Message(e, transport.target(e), e.stream) for e in events]


def event(stream: str = "s1", n: int = 0, **fields: Any) -> Event:
    """A small JSON event numbered ``n`` on ``stream``."""
    fields.setdefault("data", {"n": n})
    return Event(type="test.webhook", stream=stream, **fields)


Answer = Callable[[asyncio.StreamWriter, bytes], Awaitable[None]]


class RawServer:
    """A tiny HTTP/1.1 server on 127.0.0.1 whose answers are raw bytes written by ``answer``.

    For what a real receiver would not do: drip an answer, chunk it, close
    early, send garbage. ``answer(writer, request)`` gets each request's head
    and body; the connection is read again after it returns unless it closed
    the writer. ``connections`` counts accepted TCP connections.
    """

    def __init__(self, answer: Answer, *, tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self.connections = 0
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def url(self) -> str:
        assert self._server is not None
        port = self._server.sockets[0].getsockname()[1]
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{port}/hook"

    async def __aenter__(self) -> RawServer:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.tls)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while not writer.is_closing():
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                await self.answer(writer, request)
                if not writer.is_closing():
                    await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError, ssl.SSLError):
            pass
        finally:
            self._tasks.discard(task)
            writer.close()


def answer_bytes(data: bytes, *, close: bool = False) -> Answer:
    """An :data:`Answer` writing ``data`` at once (then closing if ``close``)."""

    async def answer(writer: asyncio.StreamWriter, request: bytes) -> None:
        writer.write(data)
        if close:
            await writer.drain()
            writer.close()

    return answer
