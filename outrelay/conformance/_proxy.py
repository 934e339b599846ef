"""A loopback TCP proxy that injects network faults between a client and its server.

Public harness code of the conformance kit (the fault checks put it between a
transport and its broker) and of the chaos tests. No third-party dependency:
asyncio streams only. Every fault is local to this proxy; the broker itself is
never touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from pathlib import Path

__all__ = ["SynBlackHole", "TcpProxy"]


class TcpProxy:
    """A loopback TCP proxy that injects network faults between a client and its server.

    Faults, usable at any time and combinable:

    * :meth:`cut` drops every open connection now (the kernel's FIN, or RST when unread data is
      pending); :meth:`reset` drops them with an RST for sure (``SO_LINGER`` 0), as a crashed
      middlebox or peer would;
    * :meth:`cut_after` arms a cut (or reset) that fires once ``nbytes`` more client→server bytes
      were forwarded, splitting a chunk if need be: the server sees half a request (mid-batch);
    * :meth:`hold` / :meth:`release` (or ``await`` :meth:`black_hole`) make the network a black
      hole: connections are accepted and nothing is answered or forwarded in either direction
      until released; then everything held flows on, as after a healed partition (the client may
      have given up on those connections meanwhile);
    * :meth:`drop_reply` arms a lost answer: the server's next bytes to the client are
      discarded and every connection is cut — the server got (and applied) the request, the
      client never hears so;
    * :attr:`latency` delays every chunk by that many seconds, each direction, pipelined (a
      link's round trip grows by twice that; throughput is not capped).

    With ``tls=(cert, key)`` it accepts TLS connections with that certificate and forwards the
    plaintext upstream (TLS termination); ``listen_port`` picks the port (0: any free one).
    :attr:`stats` counts connections accepted, faults fired and client→server bytes forwarded
    (``bytes_up``: a caller measures one request's size with it, to cut the next one midway).
    """

    def __init__(self, host: str, port: int, *, tls: tuple[Path, Path] | None = None, listen_port: int = 0) -> None:
        self.upstream = (host, port)
        self.port = listen_port
        self.latency = 0.0
        self.stats = {"connections": 0, "cuts": 0, "resets": 0, "bytes_up": 0, "replies_dropped": 0}
        self.reply_armed = False
        self._ssl: ssl.SSLContext | None = None
        if tls is not None:
            self._ssl = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            self._ssl.load_cert_chain(str(tls[0]), str(tls[1]))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._cut_in: int | None = None  # client→server bytes until an armed cut fires
        self._cut_rst = False
        self._cut_hold = False

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", self.port, ssl=self._ssl)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.stats["connections"] += 1
        try:
            await self._flowing.wait()  # a black hole accepts, then never answers
            try:
                up_reader, up_writer = await asyncio.open_connection(*self.upstream)
            except OSError:
                writer.close()
                return
            self._writers |= {writer, up_writer}
            await asyncio.gather(self._pipe(reader, up_writer, True), self._pipe(up_reader, writer, False))
        except asyncio.CancelledError:
            writer.transport.abort()
        finally:
            self._tasks.discard(task)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, to_server: bool) -> None:
        """Forward ``src`` to ``dst``: each chunk ``latency`` s after it was read, held while black-holed."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[tuple[float, bytes] | None] = asyncio.Queue()

        async def forward() -> None:
            while (item := await queue.get()) is not None:
                due, data = item
                if (delay := due - loop.time()) > 0:
                    await asyncio.sleep(delay)
                await self._flowing.wait()
                if dst.is_closing():
                    return
                if not to_server and self.reply_armed:  # the answer to what the server just applied: lost
                    self.reply_armed = False
                    self.stats["replies_dropped"] += 1
                    self.cut()
                    return
                fire, rest = False, b""
                if to_server and self._cut_in is not None:
                    data, rest, fire = data[: self._cut_in], data[self._cut_in :], len(data) >= self._cut_in
                    self._cut_in -= len(data)
                dst.write(data)
                if to_server:
                    self.stats["bytes_up"] += len(data)
                await dst.drain()
                if fire:
                    self._cut_in = None
                    if self._cut_hold:  # a stall: the rest of the request (and every answer) is held
                        self.hold()
                        await self._flowing.wait()
                        if rest and not dst.is_closing():
                            dst.write(rest)
                            await dst.drain()
                        continue
                    if self._cut_rst:
                        self.reset()
                    else:
                        self.cut()
                    return

        sender = asyncio.create_task(forward())
        with contextlib.suppress(OSError):
            while data := await src.read(65536):
                queue.put_nowait((loop.time() + self.latency, data))
        queue.put_nowait(None)
        with contextlib.suppress(OSError):
            await sender
        dst.close()

    def cut(self) -> None:
        """Drop every open connection now."""
        self.stats["cuts"] += 1
        for w in self._writers:
            w.transport.abort()
        self._writers.clear()

    def reset(self) -> None:
        """Drop every open connection with an RST (``SO_LINGER`` 0): the peer's next read or write
        fails with ECONNRESET instead of seeing a clean end of stream."""
        self.stats["resets"] += 1
        for w in self._writers:
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            w.transport.abort()
        self._writers.clear()

    def cut_after(self, nbytes: int, *, rst: bool = False) -> None:
        """Arm a :meth:`cut` (``rst``: a :meth:`reset`) firing once ``nbytes`` more client→server
        bytes were forwarded (the last chunk is truncated there, so a request arrives half-sent)."""
        self._cut_in, self._cut_rst, self._cut_hold = max(nbytes, 1), rst, False

    def stall_after(self, nbytes: int) -> None:
        """Arm a :meth:`hold` firing once ``nbytes`` more client→server bytes were forwarded:
        the server sees half a request, then the link goes silent in both directions (a stalled
        peer or a partition mid-request) until :meth:`release`."""
        self._cut_in, self._cut_rst, self._cut_hold = max(nbytes, 1), False, True

    def drop_reply(self) -> None:
        """Arm a lost answer: the next server→client bytes are dropped and every connection cut."""
        self.reply_armed = True

    @property
    def armed(self) -> bool:
        """True while a :meth:`cut_after` or :meth:`stall_after` has not fired yet."""
        return self._cut_in is not None

    def hold(self) -> None:
        """Start a black hole: accept connections, forward and answer nothing."""
        self._flowing.clear()

    def release(self) -> None:
        """End the black hole: what was held flows on."""
        self._flowing.set()

    async def black_hole(self, seconds: float) -> None:
        """:meth:`hold` for ``seconds``, then :meth:`release`."""
        self.hold()
        try:
            await asyncio.sleep(seconds)
        finally:
            self.release()

    async def stop(self) -> None:
        """Drop every connection and stop listening (idempotent)."""
        self._cut_in = None
        self.release()
        self.cut()
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


class SynBlackHole:
    """A loopback address where TCP connections never complete: a listening socket whose accept
    queue is full and never drained, so the kernel drops every further SYN (the client's
    ``connect()`` hangs until its own timeout, as towards a host that vanished). Synchronous:
    :meth:`start` blocks ~0.1 s (call it in a thread)."""

    def __init__(self) -> None:
        self._socks: list[socket.socket] = []
        self.port = 0

    def start(self) -> int:
        """Listen and fill the accept queue; returns the port."""
        listener = socket.socket()
        self._socks.append(listener)
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        self.port = listener.getsockname()[1]
        for _ in range(8):  # the queue holds backlog + 1 on Linux; fill until a connect no longer completes
            filler = socket.socket()
            filler.settimeout(0.1)
            try:
                filler.connect(("127.0.0.1", self.port))
            except OSError:
                filler.close()
                break
            self._socks.append(filler)
        return self.port

    async def stop(self) -> None:
        """Close every socket (idempotent)."""
        for sock in self._socks:
            sock.close()
        self._socks.clear()
