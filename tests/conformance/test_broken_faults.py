"""Each fault check fails a ``line`` transport with the one defect it is meant to catch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outrelay.core.contract.transport import Delivered, Message, Rejected, RetryLater, SendResult
from outrelay.core.model.errors import PermanentError
from tests.conformance._broken import assert_fails
from tests.conformance._line import LineTransport, line_target


class NoReconnect(LineTransport):
    """Once the connection is lost it never connects again."""

    dead = False

    def _drop(self) -> None:
        self.dead = self.dead or (self._conn is not None and self._state == "open")
        super()._drop()

    async def send_one(self, m: Message) -> SendResult:
        if self.dead:
            return RetryLater("not connected")
        return await super().send_one(m)


class LeaksOSError(LineTransport):
    """Lets the socket's own exception escape send()."""

    async def send_one(self, m: Message) -> SendResult:
        return self.classify(await self.roundtrip(self.request(m)))


class LiesDelivered(LineTransport):
    """Reports Delivered when the connection drops before the answer."""

    async def send_one(self, m: Message) -> SendResult:
        r = await super().send_one(m)
        return Delivered() if isinstance(r, RetryLater) and "connection lost" in r.error else r


class LeavesHoles(LineTransport):
    """Goes on with a key's next message after one failed (no halting): a lost message leaves a hole."""

    async def send(self, batch: Any) -> list[SendResult]:
        return [await self.send_one(m) for m in batch]


class WaitsForever(LineTransport):
    """Reads answers without a deadline."""

    async def roundtrip(self, doc: dict[str, Any]) -> str:
        self.cfg = self.cfg.model_copy(update={"timeout": 3600.0})
        return await super().roundtrip(doc)


class TimeoutIsPermanent(LineTransport):
    """Treats a timeout as a permanent failure."""

    async def send_one(self, m: Message) -> SendResult:
        r = await super().send_one(m)
        return Rejected("timed out") if isinstance(r, RetryLater) else r


class HandshakeIsPermanent(LineTransport):
    """open() shakes hands and calls a silent broker a permanent error."""

    async def open(self) -> None:
        await super().open()
        try:
            await self.roundtrip({"op": "check", "tok": self.cfg.token.get_secret_value()})
        except TimeoutError:
            raise PermanentError("the broker did not answer the handshake") from None


def test_fault_cut_idle_catches_no_reconnect(tmp_path: Path) -> None:
    assert_fails(line_target(NoReconnect), "fault_cut_idle", tmp_path, "reconnect by itself")


def test_fault_reset_idle_catches_leaked_socket_error(tmp_path: Path) -> None:
    assert_fails(line_target(LeaksOSError), "fault_reset_idle", tmp_path, "map vendor exceptions")


def test_fault_cut_mid_batch_catches_false_delivered(tmp_path: Path) -> None:
    assert_fails(line_target(LiesDelivered), "fault_cut_mid_batch", tmp_path, "cannot be read back")


def test_fault_reset_mid_batch_catches_holes(tmp_path: Path) -> None:
    assert_fails(line_target(LeavesHoles), "fault_reset_mid_batch", tmp_path, "never leave a hole")


def test_fault_stall_mid_batch_catches_missing_deadline(tmp_path: Path) -> None:
    assert_fails(line_target(WaitsForever), "fault_stall_mid_batch", tmp_path, "did not return within")


def test_fault_black_hole_send_catches_permanent_timeouts(tmp_path: Path) -> None:
    assert_fails(line_target(TimeoutIsPermanent), "fault_black_hole_send", tmp_path, "must give RetryLater")


def test_fault_black_hole_open_catches_permanent_handshake(tmp_path: Path) -> None:
    assert_fails(line_target(HandshakeIsPermanent), "fault_black_hole_open", tmp_path, "expected RetryableError")


def test_fault_black_hole_check_catches_missing_deadline(tmp_path: Path) -> None:
    assert_fails(line_target(WaitsForever), "fault_black_hole_check", tmp_path, "did not return within")
