"""Each v3 check fails a ``line`` transport with the one defect it is meant to catch (the correct ``line``
passes every check: ``test_line.py``); a busy but non-blocking transport passes the loop watch."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

from outrelay.conformance._harness import run_check
from outrelay.core.contract.transport import Capabilities, Message, Rejected, RetryLater, SendResult
from outrelay.core.model.errors import PermanentError, RetryableError
from tests.conformance._broken import assert_fails
from tests.conformance._line import LineTransport, line_target


class BlocksTheLoop(LineTransport):
    """A synchronous call in send(): the event loop stalls 51 ms per message."""

    async def send_one(self, m: Message) -> SendResult:
        time.sleep(0.051)
        return await super().send_one(m)


class BusyButNotBlocking(LineTransport):
    """Burns 60 ms of CPU per batch (encoding, say): busy, but never asleep in a blocking call."""

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        end = time.perf_counter() + 0.06
        while time.perf_counter() < end:
            pass
        return await super().send(batch)


class HeartbeatLeft(LineTransport):
    """Starts a heartbeat task in open() that close() never stops."""

    async def open(self) -> None:
        await super().open()
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat())

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(0.5)


class RetryTaskOnFailedOpen(LineTransport):
    """A failing open() leaves a reconnect task running (the relay retries open() without close())."""

    async def open(self) -> None:
        try:
            await super().open()
        except RetryableError:
            self._retry = asyncio.get_running_loop().create_task(asyncio.sleep(3600))
            raise


class KeepsSocketOnFailedCheck(LineTransport):
    """check() with credentials that may not publish raises, leaving its connection open."""

    async def check(self) -> str:
        answer = await self.roundtrip({"op": "check", "tok": self.cfg.token.get_secret_value()})
        if answer == "forbidden":
            raise PermanentError("the token may not publish: grant it publish permission")
        self._drop()
        return "reachable"


class SwallowsCancel(LineTransport):
    """Catches CancelledError in send() and reports the batch RetryLater instead."""

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        try:
            return await super().send(batch)
        except asyncio.CancelledError:
            return [RetryLater("cancelled") for _ in batch]


class SwallowsCancelWithoutDeadline(SwallowsCancel):
    """Swallows cancellation and has no deadline of its own: only the suite's bound ends a stalled send."""

    async def roundtrip(self, doc: dict[str, Any]) -> str:
        self.cfg = self.cfg.model_copy(update={"timeout": 3600.0})
        return await super().roundtrip(doc)


class SharedTarget(LineTransport):
    """Keeps the target in a class attribute: the last instance opened wins for every instance."""

    current: ClassVar[str] = ""

    async def open(self) -> None:
        await super().open()
        SharedTarget.current = self.cfg.target

    def target(self, event: Any) -> str:
        return SharedTarget.current or self.cfg.target


class DropsTraceContext(LineTransport):
    """Sends only the headers it knows: the promoted traceparent, tracestate and keyid are lost."""

    def request(self, m: Message) -> dict[str, Any]:
        doc = super().request(m)
        doc["h"] = {k: v for k, v in doc["h"].items() if k not in ("ce-traceparent", "ce-tracestate", "ce-keyid")}
        return doc


class NoConnectTimeout(LineTransport):
    """Connects without a timeout: a host that drops SYNs hangs open() for minutes."""

    async def _connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self._conn is None:
            try:
                self._conn = await asyncio.open_connection(self.cfg.host, self.cfg.port)
            except OSError as exc:
                raise RetryableError(f"unreachable: {exc!r}") from None
        return self._conn


class ResendsOnReconnect(LineTransport):
    """After a lost connection it reconnects and re-sends at once, under a fresh dedupe id."""

    def request(self, m: Message) -> dict[str, Any]:
        doc = super().request(m)
        if getattr(self, "_resending", False):
            doc["d"] = f"{m.event.id}-{uuid.uuid4().hex[:6]}"
        return doc

    async def send_one(self, m: Message) -> SendResult:
        r = await super().send_one(m)
        if isinstance(r, RetryLater) and "connection lost" in r.error:
            self._resending = True
            try:
                return await super().send_one(m)
            finally:
                self._resending = False
        return r


class SortsBatch(LineTransport):
    """Sorts the caller's batch list in place by key."""

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        assert isinstance(batch, list)
        batch.sort(key=lambda m: m.key)
        return await super().send(batch)


class Volatile(LineTransport):
    """Publishes pub/sub style (kept for nobody when no reader listens) yet declares at_least_once."""

    def request(self, m: Message) -> dict[str, Any]:
        return super().request(m) | {"volatile": True}


class VolatileDeclared(Volatile):
    """The same broker, honestly declared at_most_once."""

    @property
    def capabilities(self) -> Capabilities:
        base = super().capabilities
        return Capabilities(ordered_batches=base.ordered_batches, native_dedupe=base.native_dedupe,
                            max_message_bytes=base.max_message_bytes, cloudevents_modes=base.cloudevents_modes,
                            reader=True, delivery="at_most_once")  # fmt: skip


class PingOnlyCheck(LineTransport):
    """check() proves it can connect, not that it may publish."""

    async def check(self) -> str:
        try:
            await self.roundtrip({"op": "ping", "tok": self.cfg.token.get_secret_value()})
        except (OSError, TimeoutError) as exc:
            raise RetryableError(f"no answer: {exc!r}") from None
        finally:
            self._drop()
        return "reachable"


class DisablesOnOversize(LineTransport):
    """Answers an oversized message by disabling the whole destination."""

    async def send_one(self, m: Message) -> SendResult:
        r = await super().send_one(m)
        return Rejected(r.reason, disable_destination=True) if isinstance(r, Rejected) else r


def test_loop_watch_catches_a_blocking_call_with_its_stack(tmp_path: Path) -> None:
    """A 51 ms synchronous sleep per message fails an ordinary check, naming the blocking line."""
    assert_fails(line_target(BlocksTheLoop), "batch_send", tmp_path, "event loop was blocked", "time.sleep(0.051)")


def test_loop_watch_lets_cpu_work_pass(tmp_path: Path) -> None:
    """Busy code that never sleeps in a blocking call is not a blocked loop."""
    run_check(line_target(BusyButNotBlocking), "batch_send", tmp_path)


def test_census_catches_a_task_left_after_close(tmp_path: Path) -> None:
    """A heartbeat task still running after close() fails the check, naming the task and where it started."""
    assert_fails(line_target(HeartbeatLeft), "open_close", tmp_path, "close() returned but 1 task(s)", "_beat")


def test_census_catches_a_task_left_by_a_failed_open(tmp_path: Path) -> None:
    """A task left by an open() that failed (no close() follows in the relay) fails the check."""
    assert_fails(line_target(RetryTaskOnFailedOpen), "start_while_broker_down", tmp_path, "open() failed and")


def test_sockets_released_catches_a_socket_kept_by_a_failed_check(tmp_path: Path) -> None:
    """A failing check() that keeps its connection open fails sockets_released."""
    assert_fails(line_target(KeepsSocketOnFailedCheck), "sockets_released", tmp_path, "failing open() or check()")


def test_cancel_mid_batch_catches_swallowed_cancellation(tmp_path: Path) -> None:
    """A send that turns its cancellation into results fails cancel_mid_batch."""
    assert_fails(line_target(SwallowsCancel), "cancel_mid_batch", tmp_path, "instead of raising CancelledError")


def test_fault_stall_no_longer_rewards_swallowed_cancellation(tmp_path: Path) -> None:
    """A stalled send that only the suite's bound ends, and that swallows that cancellation, fails the stall."""
    target = line_target(SwallowsCancelWithoutDeadline, timeout=1.5)
    assert_fails(target, "fault_stall_mid_batch", tmp_path, "never swallow CancelledError")


def test_instances_isolated_catches_shared_state(tmp_path: Path) -> None:
    """Two instances sharing their target through a class attribute fail instances_isolated."""
    assert_fails(line_target(SharedTarget), "instances_isolated", tmp_path, "instances must share no state")


def test_metadata_roundtrip_catches_dropped_trace_context(tmp_path: Path) -> None:
    """Dropping the promoted traceparent/tracestate/keyid attributes fails metadata_roundtrip."""
    assert_fails(line_target(DropsTraceContext), "metadata_roundtrip", tmp_path, "traceparent")


def test_connect_black_hole_catches_a_connect_without_timeout(tmp_path: Path) -> None:
    """A connect without a timeout hangs against an address that drops SYNs: the check fails on the bound."""
    assert_fails(line_target(NoConnectTimeout, timeout=2.0), "connect_black_hole", tmp_path, "did not return within")


def test_reply_lost_catches_a_resend_stored_twice(tmp_path: Path) -> None:
    """A transport that re-sends after a lost reply under a fresh dedupe id has the event stored twice."""
    assert_fails(line_target(ResendsOnReconnect), "fault_reply_lost", tmp_path, "stored 2x")


def test_batch_left_unchanged_catches_an_in_place_sort(tmp_path: Path) -> None:
    """Sorting the caller's list fails batch_left_unchanged, and the census fails any other check that sends."""
    assert_fails(line_target(SortsBatch), "batch_left_unchanged", tmp_path, "reordered the caller's batch list")
    assert_fails(line_target(SortsBatch), "per_key_order", tmp_path, "reordered the caller's batch list")


def test_durable_late_reader_catches_an_at_most_once_broker_claiming_durability(tmp_path: Path) -> None:
    """A broker that keeps nothing for absent readers fails durable_late_reader unless declared at_most_once."""
    assert_fails(line_target(Volatile), "durable_late_reader", tmp_path, "found 0 of 4")
    try:
        run_check(line_target(VolatileDeclared), "durable_late_reader", tmp_path)
    except BaseException as exc:  # pytest.skip's exception
        assert "at_most_once" in str(exc)
    else:
        raise AssertionError("durable_late_reader ran for a transport declaring at_most_once")


def test_forbidden_check_catches_a_check_that_only_connects(tmp_path: Path) -> None:
    """check() that succeeds for credentials which may connect but not publish fails forbidden_check_says_what."""
    assert_fails(line_target(PingOnlyCheck), "forbidden_check_says_what", tmp_path, "reported success")


def test_oversize_rejection_never_disables_the_destination(tmp_path: Path) -> None:
    """Rejected(disable_destination=True) for an oversized message fails payload_over_max_rejected."""
    assert_fails(line_target(DisablesOnOversize), "payload_over_max_rejected", tmp_path, "disable_destination=True")
