"""Failed NATS connection attempts close their sockets (a nats-py 2.16 leak the chaos runs found, now fixed).

The bug: nats-py's ``Client._attempt_reconnect`` opens a TCP connection,
and when the handshake on it fails (the peer accepts, then closes before
INFO/CONNECT complete: a load balancer or proxy in front of a dead broker; or
accepts and never answers: a black hole), it reports the error to
``error_cb`` and loops to the next attempt without closing that connection.
The next ``TcpTransport.connect`` then overwrites the writer, and each
attempt (every ``reconnect_time_wait``) leaves one socket to the garbage
collector (``ResourceWarning: unclosed StreamWriter``). A broker that refuses
connections outright does not trigger it.

The fix (``outrelay/transports/nats/_sockets.py``): the ``error_cb`` that
``outrelay.transports.nats._client.connect`` installs closes the failed
attempt's writers when nats-py calls it from its reconnect task. Each writer
is closed, given a short bound to finish closing, and then aborted. ``connect``
also closes the half-open socket when the first connect is cancelled or passes
its bound mid-handshake. The conformance check ``fault_black_hole_send`` also
covers the reconnect leak. These tests fail if a nats-py upgrade renames the
private attributes the fix relies on.
"""

from __future__ import annotations

import asyncio
import gc
import warnings
from collections.abc import Awaitable, Callable

import pytest

from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._transport import NatsTransport
from tests.peers.nats import NatsServer
from tests.peers.proxy import TcpProxy


async def test_failed_reconnect_handshakes_leave_no_open_sockets(
    nats_server: NatsServer, proxy_to: Callable[[int], Awaitable[TcpProxy]]
) -> None:
    """A NATS destination reconnecting through an endpoint that accepts and then drops every connection
    (a proxy in front of a dead broker) closes each socket it opened: none is left to the garbage collector."""
    proxy = await proxy_to(nats_server.port)
    cfg = NatsConfig(
        servers=(f"nats://127.0.0.1:{proxy.port}",), subject="leak.{stream}", connect_timeout=0.5,
        reconnect_time_wait=0.05,
    )  # fmt: skip
    transport = NatsTransport(cfg, destination="leak")
    await transport.open()
    # record (not raise) the ResourceWarning of every socket the garbage collector has to close
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            nats_server.kill()
            proxy.cut()
            await asyncio.sleep(1.5)  # nats-py tries again every reconnect_time_wait: accepted, then dropped
            attempts = proxy.stats["connections"] - 1
        finally:
            await asyncio.wait_for(transport.close(), 10)
        gc.collect()
    leaked = [w for w in caught if "StreamWriter" in str(w.message)]
    assert attempts >= 3, f"only {attempts} reconnect attempts: the test proves nothing"
    assert not leaked, f"{len(leaked)} sockets of {attempts} failed reconnect attempts were left to the GC"


async def test_open_cancelled_mid_handshake_leaves_no_open_socket(
    nats_server: NatsServer, proxy_to: Callable[[int], Awaitable[TcpProxy]]
) -> None:
    """An open() cancelled while nats-py waits for the server's INFO (a black-holed link) closes the
    socket it had opened: none is left to the garbage collector."""
    proxy = await proxy_to(nats_server.port)
    proxy.hold()  # accepted, never answered
    cfg = NatsConfig(servers=(f"nats://127.0.0.1:{proxy.port}",), subject="leak.{stream}", connect_timeout=5)
    transport = NatsTransport(cfg, destination="leak")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(transport.open(), 0.5)
        await asyncio.sleep(0.1)  # let a socket closed by open()'s cleanup finish closing
        gc.collect()
    leaked = [w for w in caught if "StreamWriter" in str(w.message)]
    assert proxy.stats["connections"] == 1, "open() never reached the proxy: the test proves nothing"
    assert not leaked, "the socket of the cancelled open() was left to the GC"
