"""The chaos tools themselves: the fault proxy does what it says, and the check catches loss and disorder."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import ClassVar

import pytest

from outrelay import Event, RunSummary
from tests.chaos._harness import Outcome
from tests.peers.proxy import TcpProxy


@pytest.fixture
async def echo() -> AsyncIterator[TcpProxy]:
    """A fault proxy in front of a loopback echo server; the server records what it received."""
    received = bytearray()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            received.extend(data)
            writer.write(data)
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    proxy = TcpProxy("127.0.0.1", server.sockets[0].getsockname()[1])
    proxy.received = received  # type: ignore[attr-defined]
    await proxy.start()
    yield proxy
    await proxy.stop()
    server.close()


class TestTcpProxy:
    async def test_cut_after_delivers_half_a_request(self, echo: TcpProxy) -> None:
        """cut_after(n) lets exactly n more bytes through to the server, then drops the connection."""
        _reader, writer = await asyncio.open_connection("127.0.0.1", echo.port)
        echo.cut_after(10)
        writer.write(b"x" * 100)
        for _ in range(500):
            if not echo.armed:
                break
            await asyncio.sleep(0.01)
        writer.close()
        await asyncio.sleep(0.05)  # the server reads what reached it before the cut
        assert bytes(echo.received) == b"x" * 10  # type: ignore[attr-defined]
        assert not echo.armed and echo.stats["cuts"] == 1

    async def test_reset_is_an_rst(self, echo: TcpProxy) -> None:
        """reset() makes the client's next read fail with ECONNRESET, not a clean end of stream."""
        reader, writer = await asyncio.open_connection("127.0.0.1", echo.port)
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        echo.reset()
        with pytest.raises(ConnectionResetError):
            await asyncio.wait_for(reader.read(), 5)
        writer.close()

    async def test_black_hole_holds_then_releases(self, echo: TcpProxy) -> None:
        """While held, a new connection is accepted and nothing answered; after release the bytes flow on."""
        echo.hold()
        reader, writer = await asyncio.open_connection("127.0.0.1", echo.port)
        writer.write(b"ping")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(reader.read(4), 0.3)
        echo.release()
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        writer.close()

    async def test_latency_delays_each_direction(self, echo: TcpProxy) -> None:
        """latency = 0.1 makes a round trip take at least 0.2 s."""
        reader, writer = await asyncio.open_connection("127.0.0.1", echo.port)
        echo.latency = 0.1
        started = time.monotonic()
        writer.write(b"ping")
        assert await asyncio.wait_for(reader.readexactly(4), 5) == b"ping"
        assert time.monotonic() - started >= 0.2
        writer.close()


def outcome(got: list[tuple[str, str]], sent: list[Event]) -> Outcome:
    summary = RunSummary({"d": {"dead_lettered": 0, "parked": 0, "retried": 0}}, [], 0.0)
    return Outcome("test", sent, got, summary, [], 7, 0.0)


class TestOutcomeCheck:
    sent: ClassVar[list[Event]] = [Event(type="t", stream=f"s{i % 2}", data={"i": i}) for i in range(6)]

    def test_redelivered_tail_passes(self) -> None:
        """Copies sent again after a fault are fine when every stream's first deliveries are in order."""
        got = [(e.id, e.stream) for e in self.sent]
        outcome(got[:4] + got[2:4] + got[4:], self.sent).check()

    def test_lost_event_fails(self) -> None:
        """An event the reader never got fails the check, naming the seed."""
        got = [(e.id, e.stream) for e in self.sent[1:]]
        with pytest.raises(AssertionError, match=r"1 of 6 events never arrived.*seed 7"):
            outcome(got, self.sent).check()

    def test_first_delivery_out_of_order_fails(self) -> None:
        """A later event of a stream arriving before an earlier one (first copies) fails the check."""
        got = [(e.id, e.stream) for e in self.sent]
        got[0], got[2] = got[2], got[0]
        with pytest.raises(AssertionError, match="stream s0 out of order at its event #0"):
            outcome(got, self.sent).check()
