"""Run one check against a deliberately broken transport and demand that it FAILS, with a useful message."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrelay.conformance import ConformanceTarget
from outrelay.conformance._harness import run_check


def assert_fails(target: ConformanceTarget, check: str, tmp_path: Path, *needles: str) -> str:
    """Run ``check``; it must fail, and its message must contain every one of ``needles``."""
    with pytest.raises(pytest.fail.Exception) as info:
        run_check(target, check, tmp_path)
    message = str(info.value)
    for needle in needles:
        assert needle in message, f"check {check} failed, but its message lacks {needle!r}: {message}"
    return message
