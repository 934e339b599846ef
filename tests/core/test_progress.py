"""Progress survives a cut: what a transport reported confirmed is never sent again.

An in-process transport built on the kit publishes one message at a time with
a configurable latency per message and records every publish; the relay runs
it over a SQLite outbox with short deadlines, so each scenario takes about a
second.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.core.config.registry import Registry
from outrelay.kit import (
    Delivered,
    LifecycleTransport,
    Message,
    NotSent,
    Progress,
    RetryLater,
    SendResult,
    TransportConfig,
    current_progress,
    send_chained,
    send_in_key_order,
    send_pipelined,
    sending,
)


class SlowConfig(TransportConfig):
    latency: float = 0.05
    #: event ids whose first publish never answers (until the send is cut)
    hang_once: tuple[str, ...] = ()
    #: follow the deadline (``progress.may_start``); False: a transport that ignores it
    soft_deadline: bool = True


PUBLISHED: list[str] = []  # every publish, in order, over all instances (the test's broker)
HUNG: set[str] = set()  # the events whose one hanging publish happened


class SlowTransport(LifecycleTransport):
    """One publish per message, ``latency`` seconds each; keys concurrently, in order per key."""

    name: ClassVar[str] = "slow"
    Config = SlowConfig

    def __init__(self, config: TransportConfig, *, destination: str = "default") -> None:
        super().__init__(config, destination=destination)
        assert isinstance(config, SlowConfig)
        self.cfg = config

    async def _open(self) -> None:
        pass

    async def _close(self) -> None:
        pass

    async def _publish(self, m: Message) -> SendResult:
        PUBLISHED.append(m.event.id)
        if m.event.id in self.cfg.hang_once and m.event.id not in HUNG:
            HUNG.add(m.event.id)
            await asyncio.Event().wait()  # until cancelled
        await asyncio.sleep(self.cfg.latency)
        return Delivered()

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        if self.cfg.soft_deadline:
            return await send_in_key_order(batch, self._publish)
        progress = current_progress()
        results: list[SendResult] = []
        for m in batch:  # one after another, reporting each, never asking may_start
            r = await self._publish(m)
            progress.report(m, r)
            results.append(r)
        return results


async def _published_at_least(n: int, relay_task: asyncio.Task[Any], within: float = 20.0) -> None:
    """Wait until ``n`` publishes happened; fail (not hang) if the relay ended or ``within`` passed first."""
    async with asyncio.timeout(within):
        while len(PUBLISHED) < n:
            if relay_task.done():
                relay_task.result()  # its error, if it failed
                pytest.fail(f"the relay ended after {len(PUBLISHED)} publishes, before {n}")
            await asyncio.sleep(0.01)


@pytest.fixture(autouse=True)
def _registered(monkeypatch: pytest.MonkeyPatch) -> None:
    PUBLISHED.clear()
    HUNG.clear()
    original = Registry.transport_spec

    def spec(self: Registry, name: str) -> Any:
        if name == "slow":
            self.add_transport("slow", SlowTransport)
        return original(self, name)

    monkeypatch.setattr(Registry, "transport_spec", spec)


def _config(tmp_path: Path, **options: Any) -> Any:
    destination = {
        "transport": "slow",
        "batch_size": 100,
        "per_stream": 16,
        "attempt_timeout": 0.4,
        "retry": {"initial_delay": 0.01, "max_delay": 0.05, "max_attempts": 100},
        **options,
    }
    relay = {"poll_interval": 0.02, "shutdown_grace": 1.0}
    return parse_config(
        {"outbox": {"url": f"sqlite:///{tmp_path}/o.db"}, "relay": relay, "destinations": {"d": destination}}
    )


def _events(tmp_path: Path, streams: int, per_stream: int) -> list[Event]:
    events = [Event(type="t.x", stream=f"s{i % streams}", data={"i": i}) for i in range(streams * per_stream)]
    with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox:
        outbox.append(events)
    return events


def _in_order(events: list[Event]) -> None:
    first: dict[str, list[str]] = collections.defaultdict(list)
    seen: set[str] = set()
    for event_id in PUBLISHED:
        if event_id not in seen:
            seen.add(event_id)
            first[next(e.stream for e in events if e.id == event_id)].append(event_id)
    for stream in {e.stream for e in events}:
        assert first[stream] == [e.id for e in events if e.stream == stream], f"stream {stream} out of order"


async def test_a_slow_destination_gets_each_event_once(tmp_path: Path) -> None:
    """5 streams x 14 events at 50 ms each against a 0.4 s deadline (a lane takes 0.7 s): the sends stop
    starting before the deadline, so every event is published exactly once, each stream in order."""
    events = _events(tmp_path, 5, 14)
    summary = await asyncio.wait_for(Relay(config=_config(tmp_path)).run(drain=True), 30)
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert collections.Counter(PUBLISHED) == collections.Counter(e.id for e in events)
    assert summary.counts["d"]["retried"] == 0  # a message not started is no failed attempt
    _in_order(events)


async def test_a_cut_send_keeps_what_was_confirmed(tmp_path: Path) -> None:
    """A send that ignores the deadline and hangs on its third message is cut at attempt_timeout: the
    two messages it reported confirmed are settled, only the hung one is published again."""
    events = _events(tmp_path, 1, 5)
    cfg = _config(tmp_path, hang_once=[events[2].id], soft_deadline=False)
    summary = await asyncio.wait_for(Relay(config=cfg).run(drain=True), 30)
    assert summary.remaining == 0
    assert [e.id for e in events[:3]] + [e.id for e in events[2:]] == PUBLISHED
    assert summary.counts["d"]["retried"] == 1


async def test_stop_finishes_what_is_in_flight_and_restart_sends_only_the_rest(tmp_path: Path) -> None:
    """stop() while a slow batch is half confirmed: what is in flight finishes, nothing new starts, the
    confirmed events settle; a relay started afterwards sends only the others: each event once in all."""
    events = _events(tmp_path, 2, 20)
    cfg = _config(tmp_path, latency=0.1, attempt_timeout=30.0, per_stream=20)
    relay = Relay(config=cfg)
    task = asyncio.create_task(relay.run())
    await _published_at_least(8, task)
    relay.stop()
    first = await asyncio.wait_for(task, 10)
    assert 0 < first.counts["d"]["delivered"] < len(events)
    assert first.counts["d"]["delivered"] == len(PUBLISHED)  # everything started was confirmed and settled
    summary = await asyncio.wait_for(Relay(config=cfg).run(drain=True), 30)
    assert summary.remaining == 0
    assert collections.Counter(PUBLISHED) == collections.Counter(e.id for e in events)
    _in_order(events)


async def test_a_send_cancelled_at_shutdown_settles_what_was_confirmed(tmp_path: Path) -> None:
    """With no shutdown grace the send is cancelled mid-batch; the confirmed events are settled before the
    relay returns, so the next relay sends again only the event that was cut and those never started."""
    events = _events(tmp_path, 1, 6)
    cfg = _config(tmp_path, hang_once=[events[3].id], soft_deadline=False, attempt_timeout=30.0)
    relay = Relay(config=cfg.model_copy(update={"relay": cfg.relay.model_copy(update={"shutdown_grace": 0.0})}))
    task = asyncio.create_task(relay.run())
    await _published_at_least(4, task)
    relay.stop()
    first = await asyncio.wait_for(task, 10)
    assert first.counts["d"]["delivered"] == 3
    await asyncio.wait_for(Relay(config=cfg).run(drain=True), 30)
    assert [e.id for e in events[:4]] + [e.id for e in events[3:]] == PUBLISHED


# -- the kit's helpers, without a relay --------------------------------------------------------------


def _batch(*streams: str) -> list[Message]:
    return [Message(e, "x", e.stream) for e in (Event(type="t", stream=s) for s in streams)]


async def test_key_order_reports_each_outcome_and_defers_what_would_overrun_the_deadline() -> None:
    """Each confirmed message is reported at once; a key's next message is not started when its
    predecessor's latency no longer fits before the deadline (NotSent), the first always is."""
    batch = _batch("a", "a", "a", "b")
    progress = Progress(asyncio.get_running_loop().time() + 0.25)
    seen: list[int] = []

    async def publish(m: Message) -> SendResult:
        seen.append(sum(isinstance(progress.outcome(x), Delivered) for x in batch))
        await asyncio.sleep(0.1)
        return Delivered()

    with sending(progress):
        results = await send_in_key_order(batch, publish)
    assert results[0] == Delivered() and results[3] == Delivered()
    assert isinstance(results[1], NotSent) and isinstance(results[2], NotSent)
    assert "deadline" in results[1].error and progress.declined
    assert [progress.outcome(m) for m in batch] == [Delivered(), None, None, Delivered()]


async def test_nothing_starts_once_stopped() -> None:
    """A stopped progress starts no message of any helper; each is NotSent saying the relay stops."""
    progress = Progress()
    progress.stop()

    async def start(m: Message) -> asyncio.Future[Any]:
        raise AssertionError("started")

    async def publish(m: Message) -> SendResult:
        raise AssertionError("published")

    def outcome(m: Message, f: asyncio.Future[Any]) -> SendResult:
        return Delivered()

    opts: dict[str, Any] = {"timeout": 1.0, "destination": "d", "log": logging.getLogger("t")}
    with sending(progress):
        for results in (
            await send_in_key_order(_batch("a", "b"), publish),
            await send_chained(_batch("a", "b"), start, outcome, **opts),
            await send_pipelined(_batch("a", "b"), start, outcome, fix="-", **opts),
        ):
            assert all(isinstance(r, NotSent) and "stopping" in r.error for r in results)


@pytest.mark.parametrize("helper", ["chained", "pipelined"])
async def test_a_cancelled_send_cancels_its_futures_and_keeps_the_confirmed(helper: str) -> None:
    """Cancelling a chained or pipelined send raises CancelledError, cancels the outcomes still awaited,
    and leaves the confirmed ones reported (the relay settles them)."""
    batch = _batch("a", "b", "c")
    loop = asyncio.get_running_loop()
    futures: list[asyncio.Future[Any]] = []

    async def start(m: Message) -> asyncio.Future[Any]:
        f: asyncio.Future[Any] = loop.create_future()
        if m is batch[0]:
            f.set_result(None)
        futures.append(f)
        return f

    def outcome(m: Message, f: asyncio.Future[Any]) -> SendResult:
        return RetryLater("cancelled") if f.cancelled() else Delivered()

    progress = Progress()
    opts: dict[str, Any] = {"timeout": 10.0, "destination": "d", "log": logging.getLogger("t")}
    with sending(progress):
        if helper == "chained":
            task = asyncio.create_task(send_chained(batch, start, outcome, **opts))
        else:
            task = asyncio.create_task(send_pipelined(batch, start, outcome, fix="-", **opts))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert all(f.done() for f in futures) and futures[1].cancelled() and futures[2].cancelled()
    assert progress.outcome(batch[0]) == Delivered()
    cut = progress.cut(batch, RetryLater("cut"))
    assert [type(r) for r in cut] == [Delivered, RetryLater, RetryLater]
