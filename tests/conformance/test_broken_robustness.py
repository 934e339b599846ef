"""Each robustness check fails a ``line`` transport with the one defect it is meant to catch."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any, ClassVar

from outrelay.core.contract.transport import Message, RetryLater, SendResult
from outrelay.core.model.errors import UsageError
from tests.conformance._broken import assert_fails
from tests.conformance._line import LineTransport, line_target


class RefusalIsTransient(LineTransport):
    """Calls a refused target a transient failure."""

    @staticmethod
    def classify(answer: str) -> SendResult:
        return RetryLater(answer) if answer.startswith("refused") else LineTransport.classify(answer)


class DropsRetryHint(LineTransport):
    """Loses the broker's retry hint."""

    @staticmethod
    def classify(answer: str) -> SendResult:
        r = LineTransport.classify(answer)
        return RetryLater(r.error) if isinstance(r, RetryLater) else r


class NewIdPerAttempt(LineTransport):
    """Gives a retry a fresh event id."""

    def request(self, m: Message) -> dict[str, Any]:
        if m.attempt > 1:
            m = Message(m.event.replace(id=f"{m.event.id}-retry-{uuid.uuid4().hex[:4]}"), m.target, m.key, m.attempt)
        return super().request(m)


class ShortDedupeMemory(LineTransport):
    """Declares dedupe for ever, but its broker remembers only the last 10 ids."""

    def request(self, m: Message) -> dict[str, Any]:
        return super().request(m) | {"forget": 10}


class ClosedForGood(LineTransport):
    """Refuses to open again once closed."""

    async def open(self) -> None:
        if self._state == "closed":
            raise UsageError("this transport was closed")
        await super().open()


class LeaksConnections(LineTransport):
    """Keeps every connection it ever made in a pool that close() never closes."""

    pool: ClassVar[list[Any]] = []

    def _drop(self) -> None:
        if self._conn is not None:
            self.pool.append(self._conn)
        self._conn = None


def test_refused_target_mixed_catches_transient_refusals(tmp_path: Path) -> None:
    assert_fails(line_target(RefusalIsTransient), "refused_target_mixed", tmp_path, "expected Rejected")


def test_throttle_retry_after_catches_lost_hint(tmp_path: Path) -> None:
    assert_fails(line_target(DropsRetryHint), "throttle_retry_after", tmp_path, "the broker's hint was 2s")


def test_retry_keeps_event_id_catches_new_ids(tmp_path: Path) -> None:
    assert_fails(line_target(NewIdPerAttempt), "retry_keeps_event_id", tmp_path, "never sent")


def test_dedupe_after_delay_catches_short_memory(tmp_path: Path) -> None:
    assert_fails(line_target(ShortDedupeMemory), "dedupe_after_delay", tmp_path, "arrived 2x")


def test_reopen_after_close_catches_closed_for_good(tmp_path: Path) -> None:
    assert_fails(line_target(ClosedForGood), "reopen_after_close", tmp_path, "open() after close() raised UsageError")


def test_sockets_released_catches_leaked_connections(tmp_path: Path) -> None:
    assert_fails(line_target(LeaksConnections), "sockets_released", tmp_path, "more sockets/files are open")
