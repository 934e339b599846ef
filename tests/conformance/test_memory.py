"""The conformance suite against the in-process ``memory`` transport."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from outrelay.conformance import Binding, ConformanceSuite, ConformanceTarget
from outrelay.conformance._harness import run_check
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

        async def publish_foreign(target: str) -> None:
            MemoryTransport.broker(broker).put_foreign(target, b"not a cloudevent", key="s0")

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
            late_reader=lambda t, target: t.reader(target, from_beginning=True),
            read_timeout=2.0,
            timeout=2.0,
            publish_foreign=publish_foreign,
            claim_timeout=1.0,  # the in-process bus hands a stopped member's messages over at once
        )


@pytest.mark.parametrize(("check", "hook"), [("throttle_retry_after", "throttle"), ("secret_never_leaks", "secret")])
def test_unsupported_hook_skip_says_why(check: str, hook: str, tmp_path: Path) -> None:
    """A hook declared ``unsupported`` skips its check with the declared reason; undeclared, the generic one."""
    make = lambda target: MemoryTransport(MemoryConfig(broker="orconf-why", target=target))  # noqa: E731
    declared = ConformanceTarget(make_transport=make, unsupported={hook: "the peer cannot, for a stated reason"})
    with pytest.raises(pytest.skip.Exception, match=f"declares no {hook}: the peer cannot, for a stated reason"):
        run_check(declared, check, tmp_path)
    with pytest.raises(pytest.skip.Exception, match=f"declares no {hook}$"):
        run_check(ConformanceTarget(make_transport=make), check, tmp_path)
