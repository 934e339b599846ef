"""The checks (placeholder until the suite lands)."""

from __future__ import annotations


class ConformanceSuite:
    """Subclass in a test module and provide a ``conformance_target`` fixture."""
