"""The WebhookReceiver (a real HTTP/1.1 server) and the webhook reader built on it."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from outrelay import Event, PermanentError, SendResult, UsageError
from outrelay.transports.webhook._reader import WebhookReader, provision_receiver
from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest
from tests.transports.webhook_support import OTHER_SECRET, SECRET, event, make_transport, messages


async def post(rx: WebhookReceiver, path: str, events: list[Event], **options: object) -> list[SendResult]:
    t = make_transport(rx.url + path, **options)
    await t.open()
    try:
        return await t.send(messages(t, events))
    finally:
        await t.close()


class TestReceiver:
    async def test_records_requests_and_scripts_answers(self) -> None:
        """respond() decides status and headers; every request is recorded with the status it got."""
        answers = iter([(429, {"retry-after": "3"}), 500, 204])
        rx = WebhookReceiver(secrets=SECRET, respond=lambda req: next(answers))
        async with rx, httpx.AsyncClient(trust_env=False) as client:
            first = await client.post(rx.url + "/a", content=b"x")
            second = await client.post(rx.url + "/a", content=b"x")
            third = await client.post(rx.url + "/a", content=b"x")
        assert (first.status_code, first.headers["retry-after"]) == (429, "3")
        assert (second.status_code, third.status_code) == (500, 204)
        assert [r.status for r in rx.requests] == [429, 500, 204]
        assert all(not r.verified and r.event is None for r in rx.requests)

    async def test_events_are_verified_and_acknowledged_only(self) -> None:
        """events() lists verified events answered 2xx; events(accepted_only=False) adds refused ones."""
        first, second = event(n=1), event(n=2)
        async with WebhookReceiver(secrets=SECRET) as rx:
            rx.respond = lambda req: 503 if req.event is not None and req.event.id == first.id else 200
            await post(rx, "/", [first])
            await post(rx, "/", [second])
        assert [e.id for e in rx.events()] == [second.id]
        assert [e.id for e in rx.events(accepted_only=False)] == [first.id, second.id]

    async def test_wait_for(self) -> None:
        """wait_for returns True once enough events arrived and False after its timeout."""
        async with WebhookReceiver(secrets=SECRET) as rx:
            assert not await rx.wait_for(1, timeout=0.1)
            sender = asyncio.create_task(post(rx, "/", [event(n=i) for i in range(3)]))
            assert await rx.wait_for(3, timeout=10)
            await sender

    async def test_slow_async_responder(self) -> None:
        """An async respond() answers later without blocking other connections."""

        async def slow(req: WebhookRequest) -> int:
            if req.path == "/slow":
                await asyncio.sleep(0.5)
            return 204

        async with WebhookReceiver(respond=slow) as rx, httpx.AsyncClient(trust_env=False) as client:
            slow_call = asyncio.create_task(client.post(rx.url + "/slow", content=b""))
            await asyncio.sleep(0.05)
            fast = await client.post(rx.url + "/fast", content=b"")
            assert fast.status_code == 204 and not slow_call.done()
            assert (await slow_call).status_code == 204

    async def test_connection_close_and_oversized_body(self) -> None:
        """'Connection: close' is honoured and an oversized body is answered 413."""
        async with WebhookReceiver(max_body=10) as rx, httpx.AsyncClient(trust_env=False) as client:
            ok = await client.post(rx.url, content=b"small", headers={"connection": "close"})
            big = await client.post(rx.url, content=b"x" * 100)
        assert ok.status_code == 204 and big.status_code == 413
        assert rx.connections == 2 and len(rx.requests) == 1

    async def test_check_pings_are_acknowledged_and_kept_from_the_application(self) -> None:
        """A verified check() ping is answered 204 by the receiver itself (respond() is not called), a wrongly
        signed one 401; neither appears in events(), accepted() or the reader."""
        calls: list[WebhookRequest] = []

        def respond(req: WebhookRequest) -> int:
            calls.append(req)
            return 500

        async with WebhookReceiver(secrets=SECRET, respond=respond) as rx, WebhookReader(rx.url + "/p") as reader:
            assert "accepted a signed ping" in await make_transport(rx.url + "/p").check()
            with pytest.raises(PermanentError, match="answered 401"):
                await make_transport(rx.url + "/p", secret=OTHER_SECRET).check()
            assert await reader.read(1, timeout=0.2) == []
        assert [(r.ping, r.verified, r.status) for r in rx.requests] == [(True, True, 204), (True, False, 401)]
        assert calls == [] and rx.events(accepted_only=False) == [] and rx.accepted() == []

    async def test_stop_is_idempotent_and_unregisters(self) -> None:
        """stop() twice is fine, and a stopped receiver no longer serves its URL."""
        rx = WebhookReceiver()
        await rx.start()
        url = rx.url
        assert WebhookReceiver.serving(url + "/x") is rx
        with pytest.raises(UsageError):
            await rx.start()
        await rx.stop()
        await rx.stop()
        assert WebhookReceiver.serving(url) is None


class TestReader:
    async def test_reads_only_its_path_after_start(self) -> None:
        """The reader returns accepted events posted to its target's path after start(), in order."""
        async with WebhookReceiver(secrets=SECRET) as rx:
            await post(rx, "/mine", [event(n=0)])
            async with WebhookReader(rx.url + "/mine") as reader:
                mine = [event("k", n=i) for i in range(3)]
                await post(rx, "/other", [event(n=9)])
                await post(rx, "/mine", mine)
                got = await reader.read(10, timeout=0.5)
        assert [r.event.id for r in got] == [e.id for e in mine]
        assert got[0].key == "k" and got[0].target == rx.url + "/mine" and got[0].headers["webhook-id"] == mine[0].id

    async def test_without_a_receiver_start_fails(self) -> None:
        """A reader for a URL no receiver serves fails on start with a UsageError."""
        with pytest.raises(UsageError, match="no WebhookReceiver"):
            await WebhookReader("http://127.0.0.1:9/none").start()

    async def test_provisioned_receiver_lives_until_its_loop_ends(self) -> None:
        """provision_receiver starts a receiver whose URL the transport's reader can read."""
        url = await provision_receiver("target-1", SECRET)
        assert url.endswith("/target-1")
        t = make_transport(url)
        await t.open()
        try:
            async with t.reader(url) as reader:
                await t.send(messages(t, [event()]))
                assert len(await reader.read(1, timeout=5)) == 1
        finally:
            await t.close()
