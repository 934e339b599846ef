"""Shared test configuration.

Tests that need a broker or emulator call :func:`tests.services.need` with
the reason; without the service they skip, but with
``OUTRELAY_REQUIRE_SERVICES=1`` (set by CI) the skip becomes a failure, so a
green CI means every service test ran.
"""

from __future__ import annotations

import pytest

from outrelay.transports.memory import MemoryTransport


@pytest.fixture(autouse=True)
def _fresh_memory_brokers() -> None:
    """Each test starts with empty in-memory brokers."""
    MemoryTransport._brokers.clear()
