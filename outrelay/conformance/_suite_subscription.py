"""The consumer-side checks as test methods, mixed into :class:`~outrelay.conformance.ConformanceSuite`.

Each runs one ``subscription_*`` check of
:mod:`outrelay.conformance._checks_subscription`; every one skips, with the
reason, for a transport that does not declare ``capabilities.subscriptions``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import outrelay.conformance._checks_subscription as _checks_subscription
from outrelay.conformance._harness import run_check
from outrelay.conformance._target import ConformanceTarget

__all__ = ["SubscriptionChecks"]

CT = ConformanceTarget
Req = pytest.FixtureRequest
_REGISTERED = _checks_subscription  # importing it registers the checks, after the publishing side's


class SubscriptionChecks:
    """The consumer side: group members in tasks and processes, failover, fan-out, positions, foreign messages."""

    def test_subscription_group_tasks(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Three members of one group in one process are handed every event once, each stream in order and with
        one member at a time, unchanged."""
        run_check(conformance_target, "subscription_group_tasks", tmp_path, request.node)

    def test_subscription_group_processes(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Two members of one group, each in a process of its own, are handed every event once, each stream in order
        and with one member at a time."""
        run_check(conformance_target, "subscription_group_processes", tmp_path, request.node)

    def test_subscription_member_killed(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A member process killed (SIGKILL) while holding unacked events: a live member is handed every one of them
        within about claim_timeout, each stream in order, and nothing is lost."""
        run_check(conformance_target, "subscription_member_killed", tmp_path, request.node)

    def test_subscription_stop_hands_over(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """stop() of a member holding unacked events hands them to a live member within about claim_timeout, each
        stream in order; stop() again returns at once and an ack after stop() is ignored."""
        run_check(conformance_target, "subscription_stop_hands_over", tmp_path, request.node)

    def test_subscription_fanout(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """Three fan-out subscribers each see every event published right after their start() returned, once, each
        stream in order, unchanged."""
        run_check(conformance_target, "subscription_fanout", tmp_path, request.node)

    def test_subscription_group_position(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A new group starts at the end of the target, and its position survives its members: what was published
        while none ran reaches the next, what was acked never comes back."""
        run_check(conformance_target, "subscription_group_position", tmp_path, request.node)

    def test_subscription_from_beginning(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A new group with from_beginning is handed the events published before its first start(), then the later
        ones, each stream in order."""
        run_check(conformance_target, "subscription_from_beginning", tmp_path, request.node)

    def test_subscription_foreign_message(self, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        """A message that is not an outrelay CloudEvent (hook publish_foreign) comes back as an Inbound with
        received=None and an error saying why, never as an exception; later events follow."""
        run_check(conformance_target, "subscription_foreign_message", tmp_path, request.node)
