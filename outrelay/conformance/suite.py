"""The conformance suite as a test class a transport author subclasses.

::

    class TestMyTransport(ConformanceSuite):
        @pytest.fixture
        def conformance_target(self) -> ConformanceTarget:
            return ConformanceTarget(make_transport=lambda target: MyTransport(MyConfig(topic=target)))

Each ``test_<check>`` method runs one check of :data:`~outrelay.conformance.CHECKS`
(the methods are made from that list, in its order, with each check's description as
their docstring)
against a fresh target (``orconf-<check>-<uuid8>``), so checks are isolated
and can run in any order. A check passes, fails with a message saying what
the transport did wrong, or skips with the reason (a capability the transport
does not declare, or a missing ``make_unreachable``). Override a method to
adapt one check (e.g. mark it ``xfail`` with the reason) — the report still
lists it. Every call into the transport is bounded by
``ConformanceTarget.timeout`` and every read by ``read_timeout``, so a broken
transport fails fast instead of hanging the run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import outrelay.conformance._checks_binding as _checks_binding
import outrelay.conformance._checks_faults as _checks_faults
import outrelay.conformance._checks_fidelity as _checks_fidelity
import outrelay.conformance._checks_flow as _checks_flow
import outrelay.conformance._checks_inproc as _checks_inproc
import outrelay.conformance._checks_lifecycle as _checks_lifecycle
import outrelay.conformance._checks_netfaults as _checks_netfaults
import outrelay.conformance._checks_robustness as _checks_robustness
import outrelay.conformance._checks_security as _checks_security
import outrelay.conformance._checks_subscription as _checks_subscription
from outrelay.conformance._harness import CHECKS, Check, run_check
from outrelay.conformance._target import ConformanceTarget

__all__ = ["ConformanceSuite"]

CT = ConformanceTarget
Req = pytest.FixtureRequest
# importing them registers the checks, in this order (the report's rows and the tests' order)
_REGISTERED = (
    _checks_fidelity,
    _checks_flow,
    _checks_lifecycle,
    _checks_faults,
    _checks_security,
    _checks_robustness,
    _checks_binding,
    _checks_inproc,
    _checks_netfaults,
    _checks_subscription,
)


def _test_method(entry: Check) -> Callable[[object, CT, Path, Req], None]:
    """The ``test_<name>`` method that runs the check ``entry`` (its description as docstring)."""
    name = entry.name

    def test(self: object, conformance_target: CT, tmp_path: Path, request: Req) -> None:
        run_check(conformance_target, name, tmp_path, request.node)

    test.__name__ = f"test_{name}"
    test.__qualname__ = f"ConformanceSuite.test_{name}"
    test.__doc__ = entry.description
    return test


class ConformanceSuite:
    """Subclass in a test module and provide a ``conformance_target`` fixture
    returning a :class:`~outrelay.conformance.ConformanceTarget`: one ``test_<check>``
    method per check of :data:`~outrelay.conformance.CHECKS`, the consumer-side
    ``subscription_*`` checks included (they skip, with the reason, for a transport
    that does not declare ``capabilities.subscriptions``)."""


for _entry in CHECKS.values():
    setattr(ConformanceSuite, f"test_{_entry.name}", _test_method(_entry))
