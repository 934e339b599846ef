"""Each consumer-side check fails a ``sqlbus`` subscription backend with the one defect it is meant to catch,
and passes the correct one (the memory transport passes them in test_memory.py)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from outrelay.conformance import CHECKS, ConformanceTarget
from outrelay.conformance._harness import run_check
from outrelay.core.contract.subscription import Inbound, SubscriptionSpec
from outrelay.core.model.errors import PermanentError, UsageError
from tests.conformance._broken import assert_fails
from tests.conformance._sqlbus import SqlBusConfig, SqlBusTransport, SqlSubscription, put_foreign

SUBSCRIPTION_CHECKS = [name for name in CHECKS if name.startswith("subscription_")]


def sqlbus_target(cls: type[SqlBusTransport], tmp_path: Path) -> ConformanceTarget:
    """The suite's target for ``cls`` on a SQLite file of the test's own."""
    path = str(tmp_path / "bus.db")

    async def publish_foreign(target: str) -> None:
        put_foreign(path, target)

    return ConformanceTarget(
        make_transport=lambda target: cls(SqlBusConfig(path=path, target=target)),
        publish_foreign=publish_foreign,
        claim_timeout=1.0,  # members stamp their liveness at every receive: keep a loaded machine from looking dead
        label="sqlbus (a SQLite file)",
        read_timeout=1.0,
        timeout=5.0,
    )


def broken(sub: type[SqlSubscription]) -> type[SqlBusTransport]:
    """The sqlbus transport with subscription backend ``sub``, a module attribute so that member processes,
    which import this module, find it by name."""
    name = f"With{sub.__name__}"
    cls = type(name, (SqlBusTransport,), {"Subscription": sub, "__module__": __name__, "__qualname__": name})
    globals()[name] = cls
    return cls


class EveryMember(SqlSubscription):
    """Hands every event to every member of a group (each member keeps a position of its own)."""

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        if self.spec.group is not None and not self.position:
            self.position = await self._txn(lambda db: db.execute("SELECT position FROM groups").fetchone()[0])
        rows = await self._txn(self._take_fanout, max_messages)
        return [self.inbound(*row) for row in rows]


class ProcessLocalGroup(SqlSubscription):
    """Names the group after the process too, so members in other processes form groups of their own."""

    def __init__(self, path: str, spec: SubscriptionSpec) -> None:
        super().__init__(path, SubscriptionSpec(spec.target, f"{spec.group}@{os.getpid()}", spec.member,
                                                spec.claim_timeout, spec.prefetch, spec.from_beginning))  # fmt: skip


class NoStreamGate(SqlSubscription):
    """Hands a free message to whoever asks, although an earlier one of its stream is with another member."""

    def choose(self, rows: list[tuple[int, str, str | None]], room: int) -> list[int]:
        return [seq for seq, _, member in rows if member is None][:room]


class ReversedBatches(SqlSubscription):
    """Returns each batch newest first."""

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        return list(reversed(await super().receive(max_messages, timeout)))


class NeverReclaims(SqlSubscription):
    """Never frees a dead member's messages."""

    def reclaim(self, db: sqlite3.Connection, now: float) -> None:
        pass


class LosesOnStop(SqlSubscription):
    """Drops a stopping member's unacked messages instead of handing them back."""

    def release(self, db: sqlite3.Connection) -> None:
        s = self.spec
        db.execute("DELETE FROM pending WHERE target = ? AND grp = ? AND member = ?", (s.target, s.group, s.member))


class AckAfterStopRaises(SqlSubscription):
    """Raises when a message is acked after stop()."""

    def _acker(self, seq: int) -> object:
        inner = super()._acker(seq)

        async def ack() -> None:
            if self.stopped:
                raise UsageError("ack() after stop()")
            await inner()  # type: ignore[operator]

        return ack


class StartsAtBeginning(SqlSubscription):
    """Starts a new group at the target's beginning."""

    def new_group_position(self, end: int) -> int:
        return 0


class IgnoresFromBeginning(SqlSubscription):
    """Starts a new group at the target's end, from_beginning or not."""

    def new_group_position(self, end: int) -> int:
        return end


class LazyFanout(SqlSubscription):
    """Resolves a fan-out position at the first receive(), not in start()."""

    async def start(self) -> None:
        await super().start()
        self.position = -1

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        if self.spec.group is None and self.position == -1:
            self.position = await self._txn(
                lambda db: db.execute("SELECT COALESCE(MAX(seq), 0) FROM msgs").fetchone()[0]
            )
        return await super().receive(max_messages, timeout)


class RaisesOnForeign(SqlSubscription):
    """Raises on a message that is not an outrelay CloudEvent."""

    def inbound(self, seq: int, stream: str, headers: str, body: bytes) -> Inbound:
        m = super().inbound(seq, stream, headers, body)
        if m.received is None:
            raise PermanentError(f"row {seq}: {m.error}")
        return m


@pytest.mark.parametrize("check", SUBSCRIPTION_CHECKS)
def test_reference_backend_passes(check: str, tmp_path: Path) -> None:
    """The correct sqlbus backend passes every consumer-side check, the member-process ones included."""
    run_check(sqlbus_target(SqlBusTransport, tmp_path), check, tmp_path)


@pytest.mark.parametrize(
    ("transport", "check", "needle"),
    [
        (broken(EveryMember), "subscription_group_tasks", "handed out twice"),
        (broken(ProcessLocalGroup), "subscription_group_processes", "handed out twice"),
        (broken(NoStreamGate), "subscription_group_tasks", "a stream's events must stay with one member"),
        (broken(ReversedBatches), "subscription_group_tasks", "out of order"),
        (broken(NeverReclaims), "subscription_member_killed", "never reached survivor"),
        (broken(LosesOnStop), "subscription_stop_hands_over", "never reached b"),
        (broken(AckAfterStopRaises), "subscription_stop_hands_over", "ack() after stop() raised UsageError"),
        (broken(StartsAtBeginning), "subscription_group_position", "published before its first start()"),
        (broken(IgnoresFromBeginning), "subscription_from_beginning", "never reached m"),
        (broken(LazyFanout), "subscription_fanout", "never reached f0"),
        (broken(RaisesOnForeign), "subscription_foreign_message", "PermanentError"),
    ],
    ids=lambda v: v.__name__ if isinstance(v, type) else None,
)
def test_check_catches_defect(transport: type[SqlBusTransport], check: str, needle: str, tmp_path: Path) -> None:
    """The check aimed at a defect fails the backend that has it, saying what went wrong."""
    assert_fails(sqlbus_target(transport, tmp_path), check, tmp_path, needle)


def test_process_local_group_passes_in_one_process(tmp_path: Path) -> None:
    """A group that only holds within one process passes the tasks check: only member processes catch it."""
    run_check(sqlbus_target(WithProcessLocalGroup, tmp_path), "subscription_group_tasks", tmp_path)  # type: ignore[name-defined]  # noqa: F821
