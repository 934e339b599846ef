"""The SSRF guard: only public addresses unless allow_private_network (loopback traffic only)."""

from __future__ import annotations

import asyncio

import pytest

from outrelay import Delivered, Rejected
from outrelay.transports.webhook._ssrf import AddressGuard, PrivateAddressRefused, address_refusal
from outrelay.transports.webhook.receiver import WebhookReceiver
from tests.transports.webhook_support import SECRET, event, make_transport, messages


class TestAddressClassifier:
    @pytest.mark.parametrize(
        ("address", "label"),
        [
            ("127.0.0.1", "loopback"),
            ("127.8.9.10", "loopback"),
            ("::1", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("fc00::1", "private"),
            ("169.254.169.254", "link-local"),
            ("fe80::1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("224.0.0.1", "multicast"),
            ("100.64.0.1", "not a public"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
        ],
    )
    def test_non_public_addresses_are_refused(self, address: str, label: str) -> None:
        """Loopback, private, link-local, unspecified, multicast, shared and mapped forms are refused."""
        reason = address_refusal(address)
        assert reason is not None and label in reason

    @pytest.mark.parametrize("address", ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111"])
    def test_public_addresses_pass(self, address: str) -> None:
        """Globally routable addresses are permitted."""
        assert address_refusal(address) is None


class _FixedDNS(AddressGuard):
    """A guard whose resolver answers a fixed address (our own seam, no network)."""

    def __init__(self, answer: str) -> None:
        super().__init__()
        self.answer = answer

    async def resolve(self, host: str, port: int) -> list[str]:
        return [self.answer]


class TestGuard:
    async def test_checks_the_resolved_address_not_the_name(self) -> None:
        """A public-looking host name that resolves to a private address is refused before connecting."""
        guard = _FixedDNS("10.0.0.5")
        with pytest.raises(PrivateAddressRefused, match=r"10\.0\.0\.5 is a private address"):
            await guard.connect("hooks.example.com", 443, asyncio.Protocol)

    async def test_localhost_name_is_refused(self) -> None:
        """'localhost' resolves to loopback and is refused."""
        with pytest.raises(PrivateAddressRefused, match="loopback"):
            await AddressGuard().connect("localhost", 9, asyncio.Protocol)

    async def test_allowed_backend_still_raises_connect_errors(self) -> None:
        """With private networks allowed, an unreachable port is an ordinary connect error."""
        from tests.services import free_port

        with pytest.raises(ConnectionRefusedError):
            await AddressGuard(allow_private=True).connect("127.0.0.1", free_port(), asyncio.Protocol)

    async def test_loopback_refused_without_option(self) -> None:
        """Sending to 127.0.0.1 without allow_private_network is a permanent error naming the option."""
        async with WebhookReceiver(secrets=SECRET) as rx:
            t = make_transport(rx.url, allow_private_network=False)
            await t.open()
            try:
                [result] = await t.send(messages(t, [event()]))
            finally:
                await t.close()
            assert isinstance(result, Rejected) and not result.disable_destination
            assert "allow_private_network = true" in result.reason and "loopback" in result.reason
            assert rx.requests == [] and rx.connections == 0

    async def test_loopback_allowed_with_option(self) -> None:
        """allow_private_network = true permits loopback delivery."""
        async with WebhookReceiver(secrets=SECRET) as rx:
            t = make_transport(rx.url.replace("127.0.0.1", "localhost"), allow_private_network=True)
            await t.open()
            try:
                [result] = await t.send(messages(t, [event()]))
            finally:
                await t.close()
        assert result == Delivered() and len(rx.events()) == 1
