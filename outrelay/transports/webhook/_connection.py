"""One HTTP/1.1 client connection: an asyncio protocol that parses the answer as bytes arrive.

Framing follows RFC 9112 §6.3: 1xx answers are skipped (101 is an error);
HEAD, 204 and 304 have no body; then ``Transfer-Encoding: chunked``,
``Content-Length``, or the body runs to connection close. At most
``body_limit`` bytes of a body are kept; past that the answer is complete
(what we keep is enough to classify and quote it) and the connection is
dropped instead of drained. A connection is :attr:`Connection.reusable`
only after an answer that ended exactly, on HTTP/1.1 without
``Connection: close``, with the whole request written.

The answer future fails with :class:`ProtocolError` (malformed, or closed
early) or the ``OSError`` the connection was lost with.
"""

from __future__ import annotations

import asyncio
from typing import NamedTuple

__all__ = ["Connection", "Origin", "ProtocolError", "Response"]

_HEAD_LIMIT = 64 * 1024


class ProtocolError(Exception):
    """The peer's answer was malformed or ended early."""


class Origin(NamedTuple):
    scheme: str
    host: str  # without IPv6 brackets
    port: int


class Response(NamedTuple):
    status: int
    headers: dict[str, str]  # lower-case names; repeated fields joined with ", "
    body: bytes  # at most body_limit bytes


class Connection(asyncio.Protocol):
    """One keep-alive connection; parses the answer as bytes arrive (see the module docstring)."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reusable = False  # the last answer left the connection usable
        self.idle_since = 0.0
        self.got_bytes = False
        self._buf = bytearray()
        self._waiter: asyncio.Future[Response] | None = None
        self._limit = 0
        self._no_body = False
        self._status = 0
        self._headers: dict[str, str] = {}
        self._mode = ""  # "", "length", "chunked", "close", "trailers"
        self._left = 0  # bytes left of the body ("length") or of the current chunk + CRLF ("chunked")
        self._body = bytearray()
        self._truncated = False
        self._keep = False

    # -- asyncio.Protocol --------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.abort()  # bytes nobody asked for: the connection's state is unknown
            return
        self.got_bytes = True
        self._buf += data
        try:
            self._advance()
        except ProtocolError as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        self._closed_by_peer(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._closed_by_peer(exc)

    # -- requests ----------------------------------------------------------------------

    def send(self, head: bytes, body: bytes, *, body_limit: int, no_body: bool) -> asyncio.Future[Response]:
        """Write one request; the future resolves with its answer."""
        assert self.transport is not None and not self.closed
        self._waiter = asyncio.get_running_loop().create_future()
        self._limit, self._no_body, self._mode, self.got_bytes = body_limit, no_body, "", False
        self.reusable = False
        self.transport.write(head + body if len(body) < 65536 else head)
        if len(body) >= 65536:
            self.transport.write(body)  # no copy of a large body
        return self._waiter

    def abort(self) -> None:
        self.closed, self.reusable = True, False
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
        self.abort()

    def _closed_by_peer(self, exc: Exception | None) -> None:
        self.closed, self.reusable = True, False
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        if self._mode == "close":
            self._keep = False
            self._finish()
        elif exc is not None:
            waiter.set_exception(exc)
        else:
            waiter.set_exception(ProtocolError("the connection closed before the answer was complete"))

    def _finish(self) -> None:
        waiter, self._waiter = self._waiter, None
        self._mode = ""
        # leftover bytes or an unsent request tail mean the exchange did not end cleanly
        sent = self.transport is not None and self.transport.get_write_buffer_size() == 0
        self.reusable = self._keep and not self.closed and not self._buf and not self._truncated and sent
        if waiter is not None and not waiter.done():
            waiter.set_result(Response(self._status, self._headers, bytes(self._body)))

    # -- parsing -----------------------------------------------------------------------

    def _advance(self) -> None:
        buf = self._buf
        while self._waiter is not None:
            if self._mode == "":
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > _HEAD_LIMIT:
                        raise ProtocolError(f"the answer's header section exceeds {_HEAD_LIMIT} bytes")
                    return
                head = bytes(buf[:end])
                del buf[: end + 4]
                self._start(head)
                continue
            if self._mode == "length":
                take = min(self._left, len(buf))
                self._keep_body(buf, take)
                self._left -= take
                done = self._left == 0
                wait = not done
            elif self._mode == "chunked":
                done, wait = False, not self._chunk(buf)
            elif self._mode == "trailers":
                done = self._trailers(buf)
                wait = not done
            else:  # "close": everything until EOF, which finishes it
                self._keep_body(buf, len(buf))
                done, wait = False, True
            if done or self._truncated:
                self._finish()  # a body over the limit is not read further: the connection is dropped
            elif wait:
                return

    def _trailers(self, buf: bytearray) -> bool:
        """Skip the trailer section after the last chunk; False when more bytes are needed."""
        if buf[:2] == b"\r\n":
            del buf[:2]
            return True
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return False
        del buf[: end + 4]
        return True

    def _keep_body(self, buf: bytearray, n: int) -> None:
        room = self._limit - len(self._body)
        if n > room:
            self._truncated = True
        self._body += buf[: min(n, room)]
        del buf[:n]

    def _start(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if version not in (b"HTTP/1.1", b"HTTP/1.0") or len(code) != 3 or not code.isdigit():
            raise ProtocolError(f"not an HTTP/1.x status line: {lines[0][:40]!r}")
        status = int(code)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon or not name or name != name.strip() or line[:1] in (b" ", b"\t"):
                raise ProtocolError(f"malformed header line {line[:40]!r}")
            key, text = name.decode("latin-1").lower(), value.strip(b" \t").decode("latin-1")
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if 100 <= status < 200:
            if status == 101:
                raise ProtocolError("the server switched protocols")
            return  # an interim answer: the real one follows
        self._status, self._headers, self._body, self._truncated = status, headers, bytearray(), False
        tokens = headers.get("connection", "").lower()
        self._keep = version == b"HTTP/1.1" and "close" not in tokens
        coding = headers.get("transfer-encoding")
        length = headers.get("content-length")
        if self._no_body or status in (204, 304):
            self._mode, self._left = "length", 0
        elif coding is not None:
            self._mode = "chunked" if coding.lower().rsplit(",", 1)[-1].strip() == "chunked" else "close"
            self._left = -1
        elif length is not None:
            values = {v.strip() for v in length.split(",")}
            if len(values) != 1 or not next(iter(values)).isdigit():
                raise ProtocolError(f"invalid Content-Length {length[:40]!r}")
            self._mode, self._left = "length", int(values.pop())
        else:
            self._mode = "close"
        if self._mode == "close":
            self._keep = False

    def _chunk(self, buf: bytearray) -> bool:
        """Consume one chunk (or its size line); False when more bytes are needed."""
        if self._left < 0:  # at a chunk-size line
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > 1024:
                    raise ProtocolError("chunk-size line too long")
                return False
            size = bytes(buf[:end]).split(b";", 1)[0].strip()
            try:
                n = int(size, 16)
            except ValueError:
                raise ProtocolError(f"invalid chunk size {size[:20]!r}") from None
            del buf[: end + 2]
            if n == 0:
                self._mode = "trailers"
                return True
            self._left = n + 2
        take = min(self._left, len(buf))
        data_part = min(take, max(0, self._left - 2))  # the chunk's data, not its trailing CRLF
        self._keep_body(buf, data_part)
        del buf[: take - data_part]
        self._left -= take
        if self._left == 0:
            self._left = -1
            return True
        return False
