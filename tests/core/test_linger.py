"""relay.linger: under steady load a few milliseconds of appends share one routing; a trickle never waits."""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.relay.handoff import RoutingHandoff
from outrelay.core.stores.sqlite import SQLiteStore
from outrelay.transports.memory import MemoryTransport


class _Idle:
    def __init__(self) -> None:
        self.idle = False
        self.wake = asyncio.Event()


async def test_hold_follows_the_last_routing_by_a_claim() -> None:
    """hold() is the rest of linger after a destination's routing began; none after a backlog, a router's
    round or with linger 0."""
    handoff = RoutingHandoff(lambda: [_Idle()], lambda: None, linger=0.05)
    assert handoff.hold() <= 0  # nothing routed yet
    handoff.appended()
    assert handoff.take()
    handoff.done()
    assert 0 < handoff.hold() <= 0.05
    await asyncio.sleep(0.06)
    assert handoff.hold() <= 0  # the appends came further apart than linger

    handoff.appended()
    assert handoff.take()
    handoff.done(backlog=True)  # a full batch: more is waiting, claim it at once
    assert handoff.hold() == 0

    await asyncio.sleep(0.06)
    assert handoff.take(router=True)  # the router's poll says nothing about the rate of appends
    handoff.done()
    assert handoff.hold() <= 0

    off = RoutingHandoff(lambda: [_Idle()], lambda: None, linger=0.0)
    off.appended()
    assert off.take()
    off.done()
    assert off.hold() <= 0
    handoff.close()
    off.close()


def _count_routings(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts SQLiteStore.route_and_claim calls that routed something (keeps the name: still run inline)."""
    calls = [0]
    original = SQLiteStore.route_and_claim

    @functools.wraps(original)
    def counting(self: SQLiteStore, *args: Any, **kwargs: Any) -> Any:
        routed, claimed = original(self, *args, **kwargs)
        if routed:
            calls[0] += 1
        return routed, claimed

    monkeypatch.setattr(SQLiteStore, "route_and_claim", counting)
    return calls


async def _relay_appends(tmp_path: Path, linger: float, count: int, spacing: float) -> tuple[list[Any], float, float]:
    """Run a relay (SQLite -> memory) while another connection appends ``count`` events ``spacing`` s apart
    over 3 streams; returns what the broker got, the longest commit -> broker time and how long appending took."""
    broker = MemoryTransport.broker(f"linger-{linger}-{spacing}")
    broker.clear()
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 5.0, "linger": linger},
            "destinations": {"mem": {"transport": "memory", "broker": f"linger-{linger}-{spacing}"}},
        }
    )
    relay = Relay(config=cfg)
    task = asyncio.create_task(relay.run())
    other = Outbox.open(cfg.outbox.url)  # another connection: the commit watcher wakes the relay
    worst = 0.0
    try:
        await asyncio.sleep(0.3)
        started = time.monotonic()
        for i in range(count):
            await asyncio.to_thread(other.append, Event(type="t.x", stream=f"s{i % 3}", data={"i": i}))
            committed = time.monotonic()
            if spacing > 0.05:  # a trickle: wait for each one, then the spacing (routings >= spacing apart)
                deadline = committed + 3.0
                while len(broker.all()) <= i and time.monotonic() < deadline:
                    await asyncio.sleep(0.001)
                worst = max(worst, time.monotonic() - committed)
            await asyncio.sleep(spacing)
        took = time.monotonic() - started
        deadline = time.monotonic() + 5.0
        while len(broker.all()) < count and time.monotonic() < deadline:
            await asyncio.sleep(0.005)
        return broker.all(), worst, took
    finally:
        other.close()
        relay.stop()
        await task


async def test_steady_appends_share_routings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends 2 ms apart: with linger 30 ms the claims' routings begin at least 30 ms apart and each takes
    several appends (with linger 0 about one each); every event arrives once, in order per stream; the
    router, whose fallback waits out the linger too, routes (almost) none of them."""
    routings = _count_routings(monkeypatch)
    router_rounds: list[int] = []
    original_route = SQLiteStore.route

    @functools.wraps(original_route)
    def route(self: SQLiteStore, *args: Any, **kwargs: Any) -> int:
        routed = original_route(self, *args, **kwargs)
        if routed and not self._db.in_transaction:  # not inside route_and_claim: the router's own round
            router_rounds.append(routed)
        return routed

    monkeypatch.setattr(SQLiteStore, "route", route)
    for sub in ("on", "off"):
        (tmp_path / sub).mkdir()
    got, _, took = await _relay_appends(tmp_path / "on", 0.03, 60, 0.002)
    lingered = routings[0]
    # none as a rule (before the fallback waited out the linger: one round in every few); a store call that
    # stalls past delay + linger (a slow disk) may let it take one
    assert len(router_rounds) <= 2, router_rounds
    assert lingered <= took / 0.03 + 2, (lingered, took)
    assert sorted(orjson.loads(m.event.data)["i"] for m in got) == list(range(60))
    for s in range(3):
        seen = [orjson.loads(m.event.data)["i"] for m in got if m.event.stream == f"s{s}"]
        assert seen == sorted(seen), seen
    routings[0] = 0
    got, _, _ = await _relay_appends(tmp_path / "off", 0.0, 60, 0.002)
    assert len(got) == 60
    assert lingered < routings[0], (lingered, routings[0])


async def test_a_trickle_never_waits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Appends 150 ms apart (each after the last arrived) with linger 100 ms: no routing is held, as each
    follows the last by more than linger."""
    holds: list[float] = []
    original = RoutingHandoff.hold

    def recording(self: RoutingHandoff) -> float:
        value = original(self)
        holds.append(value)
        return value

    monkeypatch.setattr(RoutingHandoff, "hold", recording)
    got, worst, _ = await _relay_appends(tmp_path, 0.1, 6, 0.15)
    assert len(got) == 6
    assert holds and max(holds) <= 0, holds
    assert worst < 0.5, worst  # as the cross-process wake-up tests: well under the 5 s poll
