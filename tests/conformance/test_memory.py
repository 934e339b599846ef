"""The conformance suite against the in-process ``memory`` transport."""

from __future__ import annotations

import uuid

import pytest

from outrelay.conformance import Binding, ConformanceSuite, ConformanceTarget
from outrelay.transports.memory import MemoryConfig, MemoryTransport

MAX_BYTES = 64 * 1024


def _unreachable(target: str) -> MemoryTransport:
    """A memory transport on a broker of its own that is down."""
    name = f"down-{uuid.uuid4().hex[:8]}"
    MemoryTransport.broker(name).down = True
    return MemoryTransport(MemoryConfig(broker=name, target=target), destination="conformance-down")


class TestMemoryConformance(ConformanceSuite):
    """Every check: a fresh in-process broker per test, max_message_bytes set so the size checks run."""

    @pytest.fixture
    def conformance_target(self) -> ConformanceTarget:
        broker = f"orconf-{uuid.uuid4().hex[:8]}"
        return ConformanceTarget(
            make_transport=lambda target: MemoryTransport(
                MemoryConfig(broker=broker, target=target, max_message_bytes=MAX_BYTES), destination="conformance"
            ),
            make_unreachable=_unreachable,
            unsupported={
                "throttle": "an in-process transport never throttles",
                "upstream": "an in-process transport has no network connection to cut",
                "secret": "an in-process transport takes no credentials",
                "make_forbidden": "an in-process transport takes no credentials",
                "refuse_target": "an in-process transport refuses no target per message",
            },
            label="memory (in-process broker)",
            binding=Binding("memory", prefix="ce-"),  # datacontenttype travels as Received.content_type
            read_timeout=2.0,
            timeout=2.0,
        )
