"""End to end: SQLite outbox -> Relay -> webhook transport -> real receiver on loopback."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest
from tests.transports.webhook_support import SECRET


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(secrets=SECRET) as rx:
        yield rx


def config(tmp_path: Path, url: str, **options: Any) -> Any:
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path / 'outbox.db'}"},
            "relay": {"poll_interval": 0.05, "drain_retry_bound": 5},
            "destinations": {
                "hooks": {
                    "transport": "webhook",
                    "url": url,
                    "secret": SECRET,
                    "allow_private_network": True,
                    "retry": {"initial_delay": 0.05, "max_delay": 0.2, "max_attempts": 1000},
                    **options,
                }
            },
        }
    )


def append(cfg: Any, events: list[Event]) -> None:
    with Outbox.open(cfg.outbox.url) as outbox:
        outbox.append(events)


async def drain(cfg: Any) -> Any:
    return await Relay(config=cfg).run(drain=True)


def per_stream(events: list[Event]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in events:
        out.setdefault(e.stream, []).append(e.id)
    return out


class TestRelayToWebhook:
    async def test_every_event_arrives_signed_in_order_per_stream(
        self, tmp_path: Path, receiver: WebhookReceiver
    ) -> None:
        """2,000 events over 20 streams all arrive once, signed, in order per stream."""
        cfg = config(tmp_path, receiver.url + "/events/{stream}")
        events = [Event(type="load.test", stream=f"s{i % 20}", data={"i": i}) for i in range(2000)]
        append(cfg, events)
        summary = await drain(cfg)
        assert summary.remaining == 0 and summary.counts["hooks"]["delivered"] == 2000
        assert all(r.verified for r in receiver.requests)
        got = receiver.events()
        assert len(got) == 2000 and len({e.id for e in got}) == 2000
        assert per_stream(got) == per_stream(events)
        assert all(r.path == f"/events/{r.event.stream}" for r in receiver.requests if r.event)

    async def test_failing_receiver_gets_events_later(self, tmp_path: Path, receiver: WebhookReceiver) -> None:
        """A receiver answering 500 for a while receives every event afterwards, still in order."""
        until = time.monotonic() + 0.6

        def flaky(req: WebhookRequest) -> int:
            return 500 if time.monotonic() < until else 204

        receiver.respond = flaky
        cfg = config(tmp_path, receiver.url)
        events = [Event(type="t", stream=f"s{i % 5}", data={"i": i}) for i in range(100)]
        append(cfg, events)
        summary = await drain(cfg)
        assert summary.remaining == 0 and summary.dead_lettered == 0
        assert any(r.status == 500 for r in receiver.requests)
        assert per_stream(receiver.events()) == per_stream(events)

    async def test_400_dead_letters_one_event_and_replay_redelivers(
        self, tmp_path: Path, receiver: WebhookReceiver
    ) -> None:
        """A 400 for one event dead-letters it while its stream and others continue; replay re-delivers it."""
        events = [Event(type="t", stream=f"s{i % 3}", data={"i": i}) for i in range(30)]
        bad = events[4]  # stream s1, second event of that stream
        receiver.respond = lambda req: 400 if req.event is not None and req.event.id == bad.id else 204
        cfg = config(tmp_path, receiver.url)
        append(cfg, events)
        summary = await drain(cfg)
        assert summary.remaining == 0
        assert {e.id for e in receiver.events()} == {e.id for e in events} - {bad.id}
        with Outbox.open(cfg.outbox.url) as outbox:
            [dl] = outbox.store.dead_letters(destination="hooks")
            assert dl.event.id == bad.id and "400" in dl.reason
            receiver.respond = None
            assert outbox.store.replay_dead([dl.id], destination=None, now=time.time()) == 1
        await drain(cfg)
        assert receiver.events()[-1].id == bad.id and len(receiver.events()) == 30

    async def test_410_disables_destination_and_keeps_events_pending(
        self, tmp_path: Path, receiver: WebhookReceiver
    ) -> None:
        """410 Gone disables the destination; nothing is dead-lettered and the events stay pending."""
        receiver.respond = lambda req: 410
        cfg = config(tmp_path, receiver.url)
        events = [Event(type="t", stream="s1", data={"i": i}) for i in range(5)]
        append(cfg, events)
        summary = await drain(cfg)
        [status] = summary.status
        assert status.disabled is not None and "410" in status.disabled
        assert status.pending == 5 and summary.dead_lettered == 0
        assert len(receiver.requests) == 1
