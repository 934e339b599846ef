"""The circuit breaker: its counting rules, and a relay holding a down webhook receiver."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from outrelay import Event, Outbox, Relay, hookimpl, parse_config
from outrelay.core.config.config import BreakerConfig
from outrelay.core.contract.transport import Delivered, NotSent, Rejected, RetryLater
from outrelay.core.relay.breaker import Breaker, read_states, save_state
from outrelay.transports.memory import MemoryTransport
from outrelay.transports.webhook.receiver import WebhookReceiver
from tests.stores.conftest import pg_schema, pg_url  # noqa: F401 - fixture
from tests.transports.webhook_support import SECRET

FAIL = RetryLater("503 Service Unavailable")


def breaker(**options: Any) -> tuple[Breaker, list[tuple[str, str]]]:
    seen: list[tuple[str, str]] = []
    b = Breaker(BreakerConfig(**options), "hooks", lambda d, state, why: seen.append((state, why)))
    return b, seen


class TestCounting:
    def test_opens_after_consecutive_failures_and_a_success_resets_the_count(self) -> None:
        """N failed attempts in a row open it; a delivery in between starts the count again."""
        b, seen = breaker(failures=3)
        b.outcomes([FAIL, FAIL, Delivered(), FAIL, FAIL], probe=False, now=100.0)
        assert not b.open and b.consecutive == 2
        b.outcomes([FAIL], probe=False, now=100.5)
        assert b.open and seen == [("open", "3 failed attempts in a row")]
        assert b.probe_wait(100.5) == pytest.approx(30.0)

    def test_not_sent_and_rejected_count_for_neither(self) -> None:
        """Events not attempted and events the destination refused neither open nor reset it."""
        b, _ = breaker(failures=2)
        b.outcomes([FAIL, NotSent("earlier one failed"), Rejected("400 Bad Request")], probe=False, now=1.0)
        assert b.consecutive == 1 and not b.open
        b.outcomes([FAIL], probe=False, now=1.0)
        assert b.open

    def test_failure_ratio_over_the_window(self) -> None:
        """A ratio of failures over the window opens it once there were min_attempts; old attempts age out."""
        b, seen = breaker(failures=1000, failure_ratio=0.5, window=10, min_attempts=6)
        b.outcomes([FAIL, Delivered(), FAIL, Delivered(), FAIL], probe=False, now=0.0)
        assert not b.open  # 3 of 5: too few attempts
        b.outcomes([FAIL] * 5, probe=False, now=20.0)  # the first five aged out: 5 of 5, still < 6 attempts
        assert not b.open
        b.outcomes([Delivered(), FAIL], probe=False, now=21.0)
        assert b.open and seen[0][1] == "6 of 7 attempts failed in 10s"

    def test_a_failed_probe_is_held_and_a_delivered_probe_closes(self) -> None:
        """A probe's retryable failure settles as NotSent (no attempt counted); its delivery closes the breaker."""
        b, seen = breaker(failures=1, probe_interval=2)
        b.outcomes([FAIL], probe=False, now=10.0)
        assert b.probe_wait(11.0) == pytest.approx(1.0) and b.probe_wait(12.0) == 0.0
        b.start_probe(12.0)
        assert b.probe_wait(13.0) == 2.0  # a probe is in flight: no second one
        held = b.outcomes([RetryLater("still down", 5.0)], probe=True, now=12.1)
        b.probe_ended()
        assert held == [NotSent("still down", 5.0)] and b.open and b.last_error == "still down"
        assert b.probe_wait(13.0) == pytest.approx(1.0)
        b.start_probe(14.0)
        assert b.outcomes([Delivered()], probe=True, now=14.1) == [Delivered()]
        assert not b.open and [s for s, _ in seen] == ["open", "closed"]

    def test_batches_in_flight_when_it_opened_do_not_vote(self) -> None:
        """While open, only probes change the state: a late delivery of an older batch does not close it."""
        b, _ = breaker(failures=1)
        b.outcomes([FAIL], probe=False, now=0.0)
        results = [Delivered(), FAIL]
        assert b.outcomes(results, probe=False, now=0.1) is results and b.open
        assert b.snapshot()["state"] == "open" and b.snapshot()["probes"] == 0


# -- end to end: relay -> webhook receiver that is down for a while ----------------------------


class Transitions:
    """A plugin recording the breaker's transitions with their times."""

    def __init__(self) -> None:
        self.seen: list[tuple[float, str]] = []

    @hookimpl
    def outrelay_breaker_changed(self, destination: str, state: str, reason: str) -> None:
        self.seen.append((time.time(), state))


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    async with WebhookReceiver(secrets=SECRET) as rx:
        yield rx


async def test_a_down_destination_is_probed_once_per_interval_and_resumes_in_order(
    tmp_path: Path, receiver: WebhookReceiver
) -> None:
    """Down for ~2 s while events keep coming: opens after 3 failures, one probe per 0.4 s, closes within
    one interval of the receiver coming back, and every event arrives in order with none dead-lettered."""
    interval = 0.4
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path / 'outbox.db'}"},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "hooks": {
                    "transport": "webhook",
                    "url": receiver.url,
                    "secret": SECRET,
                    "allow_private_network": True,
                    "batch_size": 1,  # one request per attempt: the receiver counts attempts exactly
                    "max_in_flight": 1,
                    # the three failures that open it are one per stream (attempt 1 each): a probe counted as
                    # an attempt would dead-letter its event (max_attempts 2)
                    "retry": {"initial_delay": 0.05, "max_delay": 0.1, "max_attempts": 2, "jitter": 0},
                    "breaker": {"failures": 3, "probe_interval": interval},
                }
            },
        }
    )
    down = True
    receiver.respond = lambda req: 503 if down else 204
    outbox = Outbox.open(cfg.outbox.url)
    relay = Relay(outbox, cfg)
    transitions = Transitions()
    relay.registry.pm.register(transitions)
    sent: list[Event] = []

    async def produce() -> None:
        for i in range(40):  # ~2 s of a steady trickle over three streams
            e = Event(type="t", stream=f"s{i % 3}", data={"i": i})
            outbox.append([e])
            sent.append(e)
            if i >= 2:  # the first of each stream are there before the relay starts
                await asyncio.sleep(0.05)

    producing = asyncio.create_task(produce())
    await asyncio.sleep(0)
    running = asyncio.create_task(relay.run())
    await producing
    up_at = time.time()
    down = False
    assert await receiver.wait_until(lambda: len(receiver.accepted()) >= len(sent), timeout=10)
    relay.stop()
    summary = await running
    outbox.close()

    opened = [t for t, s in transitions.seen if s == "open"]
    closed = [t for t, s in transitions.seen if s == "closed"]
    assert len(opened) == 1 and len(closed) == 1, transitions.seen
    failed = [r for r in receiver.requests if r.status == 503]
    before = [r for r in failed if r.received_at <= opened[0]]
    probes = [r.received_at for r in receiver.requests if opened[0] < r.received_at <= closed[0]]
    assert len(before) == 3  # the configured failures, then nothing but probes
    expected = (up_at - opened[0]) / interval  # probes while the receiver was down
    assert expected - 1 <= len([t for t in probes if t <= up_at]) <= expected + 1, (expected, probes)
    assert all(b - a >= interval * 0.9 for a, b in itertools.pairwise(probes)), probes
    assert closed[0] - up_at <= interval + 0.2
    assert summary.dead_lettered == 0 and summary.remaining == 0
    got: dict[str, list[int]] = {}
    for e in receiver.events():
        got.setdefault(e.stream, []).append(e.json()["i"])
    assert got == {s: sorted(v) for s, v in got.items()} and sum(map(len, got.values())) == len(sent)


async def test_drain_does_not_wait_for_a_destination_whose_breaker_is_open(tmp_path: Path) -> None:
    """`run(drain=True)` ends once the breaker is open, as for a disabled destination: events stay pending."""
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path / 'outbox.db'}"},
            "relay": {"poll_interval": 0.05, "drain_retry_bound": 5},
            "destinations": {
                "m": {
                    "transport": "memory",
                    "broker": "down",
                    "retry": {"initial_delay": 0.01, "max_delay": 0.02, "max_attempts": 1000},
                    "breaker": {"failures": 3, "probe_interval": 0.2},
                }
            },
        }
    )
    MemoryTransport.broker("down").fail_next = 1_000_000  # every send fails retryably (opening works)
    with Outbox.open(cfg.outbox.url) as outbox:
        outbox.append([Event(type="t", stream="s", data={"i": i}) for i in range(5)])
    started = time.monotonic()
    summary = await asyncio.wait_for(Relay(config=cfg).run(drain=True), 10)
    assert summary.remaining == 5 and summary.dead_lettered == 0
    assert time.monotonic() - started < 3


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_state_next_to_the_outbox_round_trips_and_is_cleared(kind: str, tmp_path: Path, request: Any) -> None:
    """An open breaker's state written by a relay is read back for `outrelay status`; a closed one, a stale row
    (its relay stopped probing) and an outbox without the table read as none."""
    url = f"sqlite:///{tmp_path / 'o.db'}" if kind == "sqlite" else pg_url(request.getfixturevalue("pg_schema"))
    Outbox.open(url).close()
    assert read_states(url, time.time()) == {}
    b, _ = breaker(failures=1, probe_interval=5)
    b.outcomes([FAIL], probe=False, now=time.time())
    save_state(url, "hooks", "relay-1", b.snapshot(), time.time())
    save_state(url, "hooks", "relay-2", b.snapshot(), time.time() - 60)  # not refreshed for 3 intervals + 30 s
    [row] = read_states(url, time.time())["hooks"]
    assert row["owner"] == "relay-1" and row["state"] == "open" and row["last_error"] == FAIL.error
    save_state(url, "hooks", "relay-1", {"state": "closed"}, time.time())
    assert read_states(url, time.time()) == {}
