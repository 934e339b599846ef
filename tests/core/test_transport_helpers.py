"""The shared helpers transports use to keep ``ordered_batches`` honest."""

from __future__ import annotations

import asyncio
import logging

import pytest

from outrelay import Delivered, Event, Message, Rejected, RetryLater
from outrelay.kit import (
    SendResult,
    hold_after_failures,
    send_chained,
    send_in_key_order,
    send_pipelined,
)

log = logging.getLogger("tests.transport_helpers")


def _batch(*streams: str) -> list[Message]:
    return [Message(e, "x", e.stream) for e in (Event(type="t", stream=s) for s in streams)]


async def test_send_in_key_order_stops_a_key_after_a_failure() -> None:
    """Keys go concurrently, one key's messages one after another; after a failure the key's
    later messages are not published at all."""
    batch = _batch("a", "a", "a", "b", "b")
    published: list[str] = []

    async def publish(m: Message) -> SendResult:
        published.append(m.event.id)
        await asyncio.sleep(0)
        return Rejected("no") if m is batch[1] else Delivered()

    results = await send_in_key_order(batch, publish)
    assert results[0] == Delivered() and isinstance(results[1], Rejected)
    assert isinstance(results[2], RetryLater) and "not sent" in results[2].error
    assert results[3:] == [Delivered(), Delivered()]
    assert batch[2].event.id not in published
    assert published.index(batch[3].event.id) < published.index(batch[4].event.id)


def test_hold_after_failures(caplog: pytest.LogCaptureFixture) -> None:
    """Outcomes that arrive together: after a stream's first failure its later failures are held
    (RetryLater), other streams are untouched, a later message the broker stored stays Delivered
    (re-sending would duplicate it) and the break in order is logged with both event ids."""
    batch = _batch("a", "a", "a", "b")
    results: list[SendResult] = [Delivered(), RetryLater("no ack"), Rejected("too big"), Delivered()]
    out = hold_after_failures(batch, results, destination="d", log=log, fix="set pipeline = false")
    assert out[:2] == [Delivered(), RetryLater("no ack")]
    assert isinstance(out[2], RetryLater) and "held back" in out[2].error
    assert out[3] == Delivered() and not caplog.records
    again: list[SendResult] = [Delivered(), RetryLater("no ack"), Delivered(), Delivered()]
    out = hold_after_failures(batch, again, destination="d", log=log, fix="set pipeline = false")
    assert out[2] == Delivered()
    assert "may be out of order" in caplog.text and "(no ack)" in caplog.text and "set pipeline = false" in caplog.text
    assert batch[2].event.id in caplog.text and batch[1].event.id in caplog.text


def test_hold_after_failures_ignores_duplicates(caplog: pytest.LogCaptureFixture) -> None:
    """A later message acked as a duplicate was stored before (in order): no warning."""
    batch = _batch("a", "a")
    out = hold_after_failures(batch, [RetryLater("x"), Delivered(duplicate=True)], destination="d", log=log, fix="f")
    assert out[1] == Delivered(duplicate=True) and not caplog.records


async def test_send_pipelined_starts_in_order_and_stops_a_key_after_a_local_failure() -> None:
    """Messages are started one after another in batch order; one that cannot be written stops
    its key's later messages (never started, RetryLater); outcomes are awaited together and a
    future still pending after the timeout is cancelled and mapped by ``outcome``."""
    batch = _batch("a", "a", "a", "b", "b")
    loop = asyncio.get_running_loop()
    started: list[str] = []
    futures: dict[str, asyncio.Future[str]] = {}

    async def start(m: Message) -> asyncio.Future[str] | SendResult:
        started.append(m.event.id)
        if m is batch[1]:
            return Rejected("too big")
        futures[m.event.id] = f = loop.create_future()
        if m is not batch[4]:  # the last one never gets an answer
            loop.call_soon(f.set_result, "ok")
        return f

    def outcome(m: Message, f: asyncio.Future[str]) -> SendResult:
        return RetryLater("no answer") if f.cancelled() else Delivered()

    results = await send_pipelined(batch, start, outcome, timeout=0.2, destination="d", log=log, fix="f")
    assert started == [batch[i].event.id for i in (0, 1, 3, 4)]
    assert results[0] == Delivered() and isinstance(results[1], Rejected)
    assert isinstance(results[2], RetryLater) and "not sent" in results[2].error
    assert results[3] == Delivered() and results[4] == RetryLater("no answer")
    assert futures[batch[4].event.id].cancelled()


async def test_send_chained_keeps_one_message_of_a_key_unconfirmed_and_stops_it_after_a_failure() -> None:
    """A key's next message is written only once its previous one is confirmed Delivered; keys
    go together (a wave's writes happen before any of its outcomes is awaited); after a refusal,
    a timeout or a local failure the key's later messages are never written (RetryLater)."""
    batch = _batch("a", "a", "a", "b", "b", "c", "c", "d", "d")
    loop = asyncio.get_running_loop()
    events: list[str] = []  # "w:<i>" when written, "c:<i>" when its outcome arrives
    index = {m.event.id: i for i, m in enumerate(batch)}

    async def start(m: Message) -> asyncio.Future[str] | SendResult:
        i = index[m.event.id]
        if i == 5:
            return Rejected("too big")  # c's first: cannot be written
        events.append(f"w:{i}")
        f: asyncio.Future[str] = loop.create_future()
        if i != 7:  # d's first never gets an answer
            loop.call_soon(lambda: (events.append(f"c:{i}"), f.set_result("no" if i == 1 else "ok")))
        return f

    def outcome(m: Message, f: asyncio.Future[str]) -> SendResult:
        if f.cancelled():
            return RetryLater("no answer")
        return Rejected("refused") if f.result() == "no" else Delivered()

    results = await send_chained(batch, start, outcome, timeout=0.2, destination="d", log=log)
    assert results[0] == Delivered() and results[1] == Rejected("refused")
    assert results[3] == results[4] == Delivered()
    assert isinstance(results[5], Rejected) and results[7] == RetryLater("no answer")
    for later in (2, 6, 8):
        assert isinstance(results[later], RetryLater) and "not sent" in results[later].error
    assert "w:2" not in events and "w:8" not in events
    assert events.index("w:1") > events.index("c:0") and events.index("w:4") > events.index("c:3")
    assert events.index("w:3") < events.index("c:0")  # the first wave is written before any outcome


@pytest.mark.parametrize("waves", [False, True])
async def test_flush_writes_what_start_staged_before_any_outcome_is_awaited(waves: bool) -> None:
    """With ``flush``, ``start`` only stages; flush runs once per batch (per wave with waves) after
    the last start and before any outcome is awaited; a flush that raises fails only through
    the futures it failed, never out of the helper."""
    batch = _batch("a", "a", "b")
    loop = asyncio.get_running_loop()
    staged: list[asyncio.Future[str]] = []
    flushes: list[int] = []

    async def start(m: Message) -> asyncio.Future[str] | SendResult:
        f: asyncio.Future[str] = loop.create_future()
        staged.append(f)
        return f

    async def flush() -> None:
        flushes.append(len(staged))
        group, staged[:] = list(staged), []
        if len(flushes) == 1:
            for f in group:
                f.set_result("ok")
            return
        for f in group:
            f.set_exception(OSError("cut"))
        raise OSError("cut")

    def outcome(m: Message, f: asyncio.Future[str]) -> SendResult:
        return RetryLater(str(f.exception())) if f.exception() else Delivered()

    kwargs = {"timeout": 1.0, "destination": "d", "log": log, "flush": flush}
    if waves:
        results = await send_chained(batch, start, outcome, **kwargs)  # type: ignore[arg-type]
        assert flushes == [2, 1]  # wave 1: a's first and b's; wave 2: a's second, whose write failed
        assert results == [Delivered(), RetryLater("cut"), Delivered()]
    else:
        results = await send_pipelined(batch, start, outcome, fix="-", **kwargs)  # type: ignore[arg-type]
        assert flushes == [3] and results == [Delivered()] * 3


async def test_send_chained_writes_a_keys_next_message_without_waiting_for_other_keys() -> None:
    """No key waits for another: while a's first outcome is still out, b's messages go one after
    another as each is confirmed; a's outcome is awaited ``timeout`` after a's message was
    started, then cancelled (RetryLater through ``outcome``) and a's later message never written."""
    batch = _batch("a", "a", "b", "b", "b")
    loop = asyncio.get_running_loop()
    written: list[int] = []
    index = {m.event.id: i for i, m in enumerate(batch)}
    slow: list[asyncio.Future[str]] = []

    async def start(m: Message) -> asyncio.Future[str] | SendResult:
        i = index[m.event.id]
        written.append(i)
        f: asyncio.Future[str] = loop.create_future()
        if i == 0:
            slow.append(f)  # never answered: times out
        else:
            loop.call_later(0.01, f.set_result, "ok")
        return f

    def outcome(m: Message, f: asyncio.Future[str]) -> SendResult:
        return RetryLater("no answer") if f.cancelled() else Delivered()

    began = loop.time()
    results = await send_chained(batch, start, outcome, timeout=0.3, destination="d", log=log)
    assert 0.3 <= loop.time() - began < 1.0
    assert written == [0, 2, 3, 4]  # b's three went while a's first was pending
    assert results[0] == RetryLater("no answer") and slow[0].cancelled()
    assert isinstance(results[1], RetryLater) and "not sent" in results[1].error
    assert results[2:] == [Delivered()] * 3


async def test_send_chained_times_out_a_later_message_after_the_first_deadline_was_answered() -> None:
    """The deadline timer is first set for a message that is then answered; a later message
    that never is still times out ``timeout`` after it was started, not earlier, not never."""
    batch = _batch("a", "a")
    loop = asyncio.get_running_loop()
    started_at: list[float] = []

    async def start(m: Message) -> asyncio.Future[str] | SendResult:
        started_at.append(loop.time())
        f: asyncio.Future[str] = loop.create_future()
        if m is batch[0]:
            loop.call_later(0.1, f.set_result, "ok")  # answered well within its deadline
        return f

    def outcome(m: Message, f: asyncio.Future[str]) -> SendResult:
        return RetryLater("no answer") if f.cancelled() else Delivered()

    results = await asyncio.wait_for(
        send_chained(batch, start, outcome, timeout=0.3, destination="d", log=log), timeout=3
    )
    waited = loop.time() - started_at[1]
    assert results == [Delivered(), RetryLater("no answer")]
    assert 0.29 <= waited < 0.6
