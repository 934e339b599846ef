"""Standard Webhooks signing and verification, alone and through a real receiver."""

from __future__ import annotations

import base64
import time

import httpx
import pytest

from outrelay.transports.webhook._signing import (
    SignatureError,
    decode_secret,
    sign,
    signature_headers,
    verify,
    verify_or_raise,
)
from outrelay.transports.webhook.receiver import WebhookReceiver
from tests.transports.webhook_support import OTHER_SECRET, SECRET, event, make_transport, messages


class TestSigning:
    def test_matches_standard_webhooks_reference_vector(self) -> None:
        """The signature equals the Standard Webhooks reference implementation's test vector."""
        key = decode_secret("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw")
        sig = sign(key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')
        assert sig == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="

    def test_plain_string_secret_is_used_as_raw_bytes(self) -> None:
        """A secret without the whsec_ prefix is its own UTF-8 bytes; a whsec_ one is base64-decoded."""
        assert decode_secret("plain-secret") == b"plain-secret"
        assert decode_secret("whsec_" + base64.b64encode(b"raw").decode()) == b"raw"

    def test_invalid_whsec_secret_is_refused(self) -> None:
        """A whsec_ secret whose rest is not base64 raises ValueError without echoing it."""
        with pytest.raises(ValueError, match="valid base64") as info:
            decode_secret("whsec_not*base64!")
        assert "not*base64" not in str(info.value)

    def test_rotation_gives_one_signature_per_secret(self) -> None:
        """Two secrets give two space-separated v1 signatures, each verifiable alone."""
        keys = [decode_secret(SECRET), decode_secret(OTHER_SECRET)]
        headers = signature_headers(keys, "evt-1", b"{}")
        sigs = headers["webhook-signature"].split(" ")
        assert len(sigs) == 2 and all(s.startswith("v1,") for s in sigs)
        assert verify(SECRET, headers, b"{}") and verify(OTHER_SECRET, headers, b"{}")
        assert not verify("whsec_" + base64.b64encode(b"x" * 32).decode(), headers, b"{}")

    def test_tampered_body_fails(self) -> None:
        """Changing one byte of the body makes verification fail."""
        headers = signature_headers([decode_secret(SECRET)], "evt-1", b'{"a":1}')
        assert verify(SECRET, headers, b'{"a":1}')
        with pytest.raises(SignatureError, match="no webhook-signature matches"):
            verify_or_raise(SECRET, headers, b'{"a":2}')

    def test_stale_timestamp_fails(self) -> None:
        """A timestamp outside the tolerance fails even with a valid signature."""
        old = int(time.time()) - 3600
        headers = signature_headers([decode_secret(SECRET)], "evt-1", b"x", timestamp=old)
        assert not verify(SECRET, headers, b"x", tolerance=300)
        assert verify(SECRET, headers, b"x", tolerance=7200)

    def test_missing_headers_and_no_secret_fail(self) -> None:
        """Missing webhook headers, or a verifier without secrets, fail verification."""
        assert not verify(SECRET, {}, b"x")
        headers = signature_headers([decode_secret(SECRET)], "evt-1", b"x")
        assert not verify(None, headers, b"x")

    def test_header_names_match_case_insensitively(self) -> None:
        """Verification finds the headers whatever their case."""
        headers = signature_headers([decode_secret(SECRET)], "evt-1", b"x")
        assert verify(SECRET, {k.title(): v for k, v in headers.items()}, b"x")


class TestReceiverVerification:
    @pytest.mark.parametrize("secret", [SECRET, "a plain shared secret"], ids=["whsec", "plain"])
    async def test_single_secret_verifies_over_loopback(self, secret: str) -> None:
        """A receiver with the transport's secret verifies every request and answers 204."""
        async with WebhookReceiver(secrets=secret) as rx:
            t = make_transport(rx.url + "/hook", secret=secret)
            await t.open()
            try:
                results = await t.send(messages(t, [event(n=i) for i in range(3)]))
            finally:
                await t.close()
        assert [type(r).__name__ for r in results] == ["Delivered"] * 3
        assert all(r.verified and r.status == 204 for r in rx.requests)

    async def test_rotation_is_accepted_by_receivers_of_either_secret(self) -> None:
        """A transport signing with old and new secrets is verified by a receiver knowing only one."""
        async with WebhookReceiver(secrets=OTHER_SECRET) as new_rx, WebhookReceiver(secrets=SECRET) as old_rx:
            for rx in (new_rx, old_rx):
                t = make_transport(rx.url, secret=[SECRET, OTHER_SECRET])
                await t.open()
                try:
                    await t.send(messages(t, [event()]))
                finally:
                    await t.close()
                assert rx.requests[0].verified
                assert len(rx.requests[0].headers["webhook-signature"].split()) == 2

    async def test_wrong_secret_is_answered_401(self) -> None:
        """A receiver with another secret marks the request unverified and rejects it (401)."""
        async with WebhookReceiver(secrets=OTHER_SECRET) as rx:
            t = make_transport(rx.url)
            await t.open()
            try:
                [result] = await t.send(messages(t, [event()]))
            finally:
                await t.close()
        assert type(result).__name__ == "Rejected" and "401" in result.reason  # type: ignore[attr-defined]
        assert not rx.requests[0].verified and rx.events() == []

    async def test_tampered_body_is_not_verified(self) -> None:
        """A correctly signed request whose body was altered in transit is not verified."""
        body = b'{"amount": 10}'
        headers = signature_headers([decode_secret(SECRET)], "evt-1", body)
        async with WebhookReceiver(secrets=SECRET) as rx, httpx.AsyncClient(trust_env=False) as client:
            response = await client.post(rx.url, content=b'{"amount": 99}', headers=headers)
        assert response.status_code == 401
        assert not rx.requests[0].verified
        assert "no webhook-signature matches" in (rx.requests[0].error or "")
