"""The SSRF guard: webhooks go only to public addresses unless allowed.

A webhook URL usually comes from a tenant or a config file, so the relay must
not become a way to reach the relay host's own network (cloud metadata at
169.254.169.254, an admin port on 127.0.0.1, a database on 10.0.0.5). The
check runs on the **resolved address at connect time**: :class:`AddressGuard`
resolves the host once, refuses every address that is not globally
routable, connects to the permitted IP literal itself (so a second DNS
answer cannot differ — DNS rebinding) and finally checks the peer address
of the connected socket. TLS still verifies the certificate against the
URL's host name, which is passed as SNI/server name, not the address we
connected to.

A refused address raises :class:`PrivateAddressRefused` (not an ``OSError``,
so it cannot be mistaken for a network failure); the transport maps it to a
permanent failure whose message names the ``allow_private_network`` option.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Callable, Iterable
from typing import TypeVar

__all__ = ["AddressGuard", "PrivateAddressRefused", "address_refusal"]

P = TypeVar("P", bound=asyncio.Protocol)

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


class AddressGuard:
    """Connects only to permitted addresses (all of them with ``allow_private``).

    Either way the resolved address is pinned: the connection goes to the
    IP literal that was checked. Addresses are tried one after another.

    :raises PrivateAddressRefused: every resolved address (or the connected
        peer) is refused.
    :raises OSError: the name does not resolve (``socket.gaierror``) or no
        permitted address accepts the connection (the last error).
    """

    def __init__(self, *, allow_private: bool = False) -> None:
        self.allow_private = allow_private

    async def resolve(self, host: str, port: int) -> list[str]:
        """The addresses of ``host`` (an IP literal is its own answer), without duplicates."""
        try:
            return [str(ipaddress.ip_address(host.strip("[]")))]
        except ValueError:
            pass
        infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        seen: dict[str, None] = {}
        for _family, _type, _proto, _canon, sockaddr in infos:
            seen.setdefault(str(sockaddr[0]).split("%", 1)[0])
        return list(seen)

    def _refusal(self, address: str) -> str | None:
        return None if self.allow_private else address_refusal(address)

    async def connect(
        self, host: str, port: int, protocol: Callable[[], P], tls: ssl.SSLContext | None = None
    ) -> tuple[asyncio.Transport, P]:
        """Open a TCP (or TLS, verified against ``host``) connection driven by ``protocol()``."""
        addresses = await self.resolve(host, port)
        refused = [r for r in map(self._refusal, addresses) if r]
        permitted = [a for a in addresses if not self._refusal(a)]
        if not permitted:
            raise PrivateAddressRefused(host, refused)
        loop = asyncio.get_running_loop()
        last: OSError | None = None
        for address in permitted:
            try:
                transport, proto = await loop.create_connection(
                    protocol, address, port, ssl=tls, server_hostname=host if tls is not None else None
                )
            except OSError as exc:
                last = exc
                continue
            # Belt and braces: the socket's real peer must be permitted too.
            peer = transport.get_extra_info("peername")
            reason = self._refusal(str(peer[0]) if peer else address)
            if reason:
                transport.abort()
                raise PrivateAddressRefused(host, [reason])
            assert isinstance(transport, asyncio.Transport)
            return transport, proto
        assert last is not None
        raise last
