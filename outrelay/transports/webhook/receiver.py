"""A real webhook receiver: an HTTP/1.1 server on loopback (asyncio + h11).

Used by the tests, the conformance suite and ``outrelay demo``::

    async with WebhookReceiver(secrets="whsec_...") as rx:
        ...                                    # point a webhook destination at rx.url
        assert await rx.wait_for(10, timeout=5)
        events = rx.events()                   # verified, acknowledged, in arrival order

Every request is recorded in :attr:`WebhookReceiver.requests` as a
:class:`WebhookRequest`: method, path, headers (lower-case names), body,
``verified`` (Standard Webhooks signature valid — always true when the
receiver has no secrets), the decoded CloudEvent (structured or binary
mode, ``None`` when the body is not one), ``error`` (why verification or
decoding failed) and the ``status`` it was answered with.

``respond(request)`` decides the answer: an ``int`` status or
``(status, headers)``, or an awaitable of either (to answer slowly); if it
raises, the answer is 500 and ``request.error`` says why. The default
answers 204 to verified requests and 401 to the rest. Connections
are kept alive (h11 handles HTTP/1.1 framing and ``Connection: close``).

The webhook transport's ``check()`` pings (an event of type
``outrelay.check``, see :mod:`outrelay.transports.webhook._ping`) are
transport handshakes, not application data: the receiver answers them
itself — 204 when the signature verifies, 401 when not — without calling
``respond``, records them with ``ping`` true, and keeps them out of
:meth:`~WebhookReceiver.events`, :meth:`~WebhookReceiver.accepted`,
:meth:`~WebhookReceiver.wait_for` and the webhook reader.

Running receivers register their URL, so :meth:`WebhookReceiver.serving`
finds the receiver behind a webhook URL; the webhook transport's reader
relies on it (the receiver *is* the consumer side of a webhook).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import ClassVar
from urllib.parse import urlsplit

import h11

from outrelay.kit import STRUCTURED_CONTENT_TYPE, Event, EventError, UsageError, from_binary, from_structured
from outrelay.transports.webhook._ping import PING_TYPE
from outrelay.transports.webhook._signing import Secrets, SignatureError, normalize_secrets, verify_or_raise

__all__ = ["Answer", "Responder", "WebhookReceiver", "WebhookRequest"]

Answer = int | tuple[int, Mapping[str, str]]
Responder = Callable[["WebhookRequest"], Answer | Awaitable[Answer]]


@dataclasses.dataclass
class WebhookRequest:
    """One request the receiver got (see the module docstring)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    verified: bool
    event: Event | None
    error: str | None = None
    status: int | None = None
    received_at: float = dataclasses.field(default_factory=time.time)

    @property
    def accepted(self) -> bool:
        """Answered with a 2xx status (the sender counts it delivered)."""
        return self.status is not None and 200 <= self.status < 300

    @property
    def ping(self) -> bool:
        """A ``check()`` ping (an event of type ``outrelay.check``), not application data."""
        return self.event is not None and self.event.type == PING_TYPE


def _decode(headers: Mapping[str, str], body: bytes) -> tuple[Event | None, str | None]:
    ctype = headers.get("content-type")
    try:
        if ctype and ctype.split(";", 1)[0].strip().lower() == STRUCTURED_CONTENT_TYPE:
            return from_structured(body), None
        if "ce-id" in headers:
            return from_binary(headers, body, content_type=ctype, percent=True), None
    except (EventError, ValueError, TypeError, KeyError) as exc:
        return None, f"not a CloudEvent: {exc}"
    return None, "not a CloudEvent: no ce-* headers and not application/cloudevents+json"


class WebhookReceiver:
    """An HTTP/1.1 webhook endpoint on ``host:port`` (0: a free port).

    :param secrets: Standard Webhooks secret(s) to verify with (``whsec_...``
        or plain strings); ``None`` disables verification.
    :param respond: the answer policy (see the module docstring); may be
        replaced at any time through the attribute of the same name.
    :param tolerance: accepted ``webhook-timestamp`` skew in seconds.
    :param max_body: larger bodies are answered 413 and the connection closed.
    """

    _serving: ClassVar[dict[str, WebhookReceiver]] = {}

    def __init__(
        self,
        secrets: Secrets = None,
        host: str = "127.0.0.1",
        port: int = 0,
        respond: Responder | None = None,
        *,
        tolerance: float = 300,
        max_body: int = 16 * 1024 * 1024,
    ) -> None:
        self._keys = normalize_secrets(secrets)
        self.host = host
        self.port = port
        self.respond = respond
        self.tolerance = tolerance
        self.max_body = max_body
        self.requests: list[WebhookRequest] = []
        #: TCP connections accepted so far (keep-alive reuse keeps it low)
        self.connections = 0
        self._server: asyncio.Server | None = None
        self._conns: set[asyncio.Task[None]] = set()
        self._waiters: set[asyncio.Event] = set()

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Listen; afterwards :attr:`url` is set. :raises UsageError: already started."""
        if self._server is not None:
            raise UsageError("this WebhookReceiver is already running")
        self._server = await asyncio.start_server(self._connection, self.host, self.port)
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._serving[self.url] = self

    async def stop(self) -> None:
        """Stop listening and drop open connections; idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        self._serving.pop(self.url, None)
        server.close()
        for task in list(self._conns):
            task.cancel()
        await asyncio.gather(*self._conns, return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> WebhookReceiver:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def url(self) -> str:
        """``http://host:port`` (no trailing slash); append any path."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @classmethod
    def serving(cls, url: str) -> WebhookReceiver | None:
        """The running receiver (in this process) that ``url`` points at, if any."""
        parts = urlsplit(url)
        return cls._serving.get(f"{parts.scheme}://{parts.netloc}")

    # -- inspection --------------------------------------------------------------

    def events(self, *, accepted_only: bool = True) -> list[Event]:
        """Events of verified requests in arrival order; by default only those
        answered 2xx (what the sender counts as delivered). Pings are left out."""
        return [
            r.event
            for r in self.requests
            if r.verified and r.event is not None and not r.ping and (r.accepted or not accepted_only)
        ]

    def accepted(self) -> list[WebhookRequest]:
        """Verified, decoded requests answered 2xx, in arrival order (pings left out)."""
        return [r for r in self.requests if r.verified and r.event is not None and not r.ping and r.accepted]

    def clear(self) -> None:
        """Forget recorded requests."""
        self.requests.clear()

    async def wait_for(self, count: int, timeout: float) -> bool:
        """Wait until :meth:`events` holds at least ``count`` events; ``False`` on timeout."""
        return await self.wait_until(lambda: len(self.events()) >= count, timeout)

    async def wait_until(self, predicate: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``predicate()`` holds, re-checked after every answered request."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        changed = asyncio.Event()
        self._waiters.add(changed)
        try:
            while not predicate():
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), remaining)
            return True
        finally:
            self._waiters.discard(changed)

    # -- serving -----------------------------------------------------------------

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        self.connections += 1
        conn = h11.Connection(h11.SERVER)
        try:
            while True:
                got = await self._read_request(conn, reader)
                if got is None:
                    break
                request, body = got
                status, headers = await self._handle(request, body)
                self._write_response(conn, writer, status, headers)
                await writer.drain()
                if conn.our_state is not h11.DONE or conn.their_state is not h11.DONE:
                    break
                conn.start_next_cycle()
        except h11.RemoteProtocolError as exc:
            # malformed request or body too large: answer once, then hang up
            status = exc.error_status_hint
            with contextlib.suppress(ConnectionError):
                writer.write(f"HTTP/1.1 {status} \r\nconnection: close\r\ncontent-length: 0\r\n\r\n".encode())
                await writer.drain()
        except (h11.LocalProtocolError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _read_request(
        self, conn: h11.Connection, reader: asyncio.StreamReader
    ) -> tuple[h11.Request, bytes] | None:
        request: h11.Request | None = None
        chunks: list[bytes] = []
        size = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                size += len(event.data)
                if size > self.max_body:
                    raise h11.RemoteProtocolError("body too large", error_status_hint=413)
                chunks.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                assert request is not None
                return request, b"".join(chunks)
            elif isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None

    async def _handle(self, request: h11.Request, body: bytes) -> tuple[int, Mapping[str, str]]:
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in request.headers}
        error: str | None = None
        verified = True
        if self._keys:
            try:
                verify_or_raise(self._keys, headers, body, self.tolerance)
            except SignatureError as exc:
                verified, error = False, str(exc)
        event, decode_error = _decode(headers, body)
        record = WebhookRequest(
            request.method.decode("ascii"),
            request.target.decode("latin-1"),
            headers,
            body,
            verified,
            event,
            error or decode_error,
        )
        self.requests.append(record)
        answer: Answer | Awaitable[Answer]
        if self.respond is None or record.ping:  # a ping is the transport's handshake, not the application's
            answer = 204 if verified else 401
        else:
            try:
                answer = self.respond(record)
                if inspect.isawaitable(answer):
                    answer = await answer
            except Exception as exc:  # a broken responder answers 500 rather than killing the connection
                record.error = f"respond() raised {type(exc).__name__}: {exc}"
                answer = 500
        status, extra = (answer, {}) if isinstance(answer, int) else answer
        record.status = int(status)
        for waiter in self._waiters:
            waiter.set()
        return record.status, extra

    @staticmethod
    def _write_response(
        conn: h11.Connection, writer: asyncio.StreamWriter, status: int, extra: Mapping[str, str]
    ) -> None:
        body = b"" if status in (204, 304) else h11_reason(status) + b"\n"
        headers = [(k.encode("latin-1"), v.encode("latin-1")) for k, v in extra.items()]
        if status not in (204, 304):
            headers.append((b"content-type", b"text/plain"))
            headers.append((b"content-length", str(len(body)).encode()))
        out = conn.send(h11.Response(status_code=status, headers=headers, reason=h11_reason(status)))
        assert out is not None
        writer.write(out)
        if body:
            writer.write(conn.send(h11.Data(data=body)) or b"")
        writer.write(conn.send(h11.EndOfMessage()) or b"")

    def __repr__(self) -> str:
        state = self.url if self._server is not None else "stopped"
        return f"<WebhookReceiver {state} requests={len(self.requests)}>"


def h11_reason(status: int) -> bytes:
    """The standard reason phrase of ``status`` (empty when unknown)."""
    from http import HTTPStatus

    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b""
