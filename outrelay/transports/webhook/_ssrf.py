"""The SSRF guard: webhooks go only to public addresses unless allowed.

A webhook URL usually comes from a tenant or a config file, so the relay must
not become a way to reach the relay host's own network (cloud metadata at
169.254.169.254, an admin port on 127.0.0.1, a database on 10.0.0.5). The
check runs on the **resolved address at connect time**, inside the httpcore
network backend: :class:`GuardedBackend` resolves the host once, refuses
every address that is not globally routable, connects to the permitted IP
literal itself (so a second DNS answer cannot differ — DNS rebinding) and
finally checks the peer address of the connected socket. TLS still verifies
the certificate against the URL's host name, because httpcore passes the
original host as SNI/server name, not the address we connected to.

A refused address raises :class:`PrivateAddressRefused` (not an ``OSError``,
so httpx does not wrap it); the transport maps it to a permanent failure
whose message names the ``allow_private_network`` option.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
import time
import typing
from collections.abc import Iterable

import httpcore
import httpx

__all__ = ["GuardedBackend", "GuardedHTTPTransport", "PrivateAddressRefused", "address_refusal"]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


class PrivateAddressRefused(Exception):
    """The destination resolved only to non-public addresses."""

    def __init__(self, host: str, reasons: Iterable[str]) -> None:
        self.host = host
        self.reasons = tuple(reasons)
        super().__init__(
            f"refused to connect to {host}: {'; '.join(self.reasons)}; webhooks go only to public addresses "
            "unless the destination sets allow_private_network = true"
        )


def address_refusal(address: str | IPAddress) -> str | None:
    """Why ``address`` may not receive webhooks, or ``None`` if it is public.

    Everything that is not globally routable is refused: loopback, private
    (RFC 1918, ULA), link-local (incl. cloud metadata 169.254.169.254),
    shared (CGNAT), unspecified, multicast, reserved, documentation ranges,
    and IPv4-mapped/-translated IPv6 forms of those.
    """
    ip = ipaddress.ip_address(address.split("%", 1)[0] if isinstance(address, str) else address)
    if isinstance(ip, ipaddress.IPv6Address):
        mapped = ip.ipv4_mapped or ip.sixtofour
        if mapped is not None:
            inner = address_refusal(mapped)
            return f"{ip} maps to {inner}" if inner else None
    for attr, label in (
        ("is_loopback", "loopback"),
        ("is_link_local", "link-local"),
        ("is_unspecified", "unspecified"),
        ("is_multicast", "multicast"),
        ("is_private", "private"),
        ("is_reserved", "reserved"),
    ):
        if getattr(ip, attr):
            return f"{ip} is a {label} address"
    if not ip.is_global:
        return f"{ip} is not a public address"
    return None


class GuardedBackend(httpcore.AsyncNetworkBackend):
    """An httpcore network backend that connects only to permitted addresses.

    With ``allow_private`` it still pins the resolved address but permits
    every one. Connection errors surface as httpcore's own ``ConnectError``/
    ``ConnectTimeout`` so httpx maps them as usual.
    """

    def __init__(self, *, allow_private: bool = False) -> None:
        self.allow_private = allow_private
        self._inner = httpcore.AnyIOBackend()

    async def _resolve(self, host: str, port: int, limit: float | None) -> list[str]:
        try:
            return [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            pass
        loop = asyncio.get_running_loop()
        try:
            # DNS counts toward the connect timeout.
            infos = await asyncio.wait_for(loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), limit)
        except TimeoutError as exc:
            raise httpcore.ConnectTimeout(f"resolving {host} timed out after {limit}s") from exc
        except socket.gaierror as exc:
            raise httpcore.ConnectError(f"cannot resolve {host}: {exc.strerror}") from exc
        seen: dict[str, None] = {}
        for _family, _type, _proto, _canon, sockaddr in infos:
            seen.setdefault(str(sockaddr[0]).split("%", 1)[0])
        return list(seen)

    def _refusal(self, address: str) -> str | None:
        return None if self.allow_private else address_refusal(address)

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        deadline = None if timeout is None else time.monotonic() + timeout
        addresses = await self._resolve(host, port, timeout)
        refused = [r for r in map(self._refusal, addresses) if r]
        permitted = [a for a in addresses if not self._refusal(a)]
        if not permitted:
            raise PrivateAddressRefused(host, refused)
        last: Exception | None = None
        for address in permitted:  # sequential fallback over the permitted addresses
            remaining = None if deadline is None else max(0.001, deadline - time.monotonic())
            try:
                stream = await self._inner.connect_tcp(
                    address, port, timeout=remaining, local_address=local_address, socket_options=socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            # Belt and braces: the socket's real peer must be permitted too.
            sock = stream.get_extra_info("socket")
            peer = sock.getpeername()[0] if sock is not None else address
            reason = self._refusal(str(peer))
            if reason:
                await stream.aclose()
                raise PrivateAddressRefused(host, [reason])
            return stream
        assert last is not None
        raise last

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,
        socket_options: typing.Iterable[httpcore.SOCKET_OPTION] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise PrivateAddressRefused(path, ["unix sockets are local"])

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class GuardedHTTPTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with its pool rebuilt on :class:`GuardedBackend`.

    httpx does not expose httpcore's ``network_backend`` parameter, so the
    pool it built is replaced by an equivalent one (same limits and TLS
    context) whose every new connection goes through the address guard.
    """

    def __init__(self, *, allow_private: bool, ssl_context: ssl.SSLContext, limits: httpx.Limits) -> None:
        super().__init__(verify=ssl_context, limits=limits, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            max_connections=limits.max_connections,
            max_keepalive_connections=limits.max_keepalive_connections,
            keepalive_expiry=limits.keepalive_expiry,
            network_backend=GuardedBackend(allow_private=allow_private),
        )
