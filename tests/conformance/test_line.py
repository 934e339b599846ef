"""The whole suite against ``line``, the kit's networked reference transport: every check passes.

This proves the new checks (faults through the proxy, refused targets,
forbidden credentials, throttling, secrets, bindings...) can be met; the
``test_broken_*`` modules prove each one fails a transport with its defect.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import HTTP
from outrelay.conformance._harness import run_check
from tests.conformance._line import LineTransport, line_target


class TestLineConformance(ConformanceSuite):
    @pytest.fixture
    def conformance_target(self) -> ConformanceTarget:
        return line_target()


class LinePercent(LineTransport):
    percent = True


class TestLineHttpBinding:
    """``line`` with percent-encoded headers declares the HTTP binding: the SDK's HTTP binding decodes it."""

    @pytest.mark.parametrize("check", ["binding_rules", "binding_sdk_decode"])
    def test_binding(self, check: str, tmp_path: Path) -> None:
        run_check(line_target(LinePercent, binding=HTTP), check, tmp_path)
