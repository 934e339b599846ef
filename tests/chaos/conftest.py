"""Chaos tests: relays run through network faults and broker kills (see ``_harness.py``).

Every test is bounded twice: its own ``asyncio.timeout`` (a stuck relay fails
with the counts and faults so far), and here a hard per-test limit, for a
hang no coroutine can interrupt (a blocked event loop): then every thread's
stack is dumped and the test process exits.
"""

from __future__ import annotations

import faulthandler
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.chaos._harness import SOAK
from tests.chaos._rigs import kafka_rig, nats_rig, proxy_to, rabbitmq_rig, redis_rig, webhook_rig

__all__ = ["kafka_rig", "nats_rig", "proxy_to", "rabbitmq_rig", "redis_rig", "webhook_rig"]

#: seconds one chaos test may take before the process is ended (CI runs the whole directory in ~1 min)
HARD_LIMIT = 150.0


@pytest.fixture(autouse=True)
def _hard_timeout(request: pytest.FixtureRequest) -> Iterator[None]:
    """Dump all stacks and exit if this test outlives :data:`HARD_LIMIT` (plus the soak's length)."""
    out: Any = sys.__stderr__
    try:  # pytest keeps a copy of the real stderr for its own faulthandler; captured output would be lost
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        fd = request.config.stash.get(fault_handler_stderr_fd_key, None)
        if fd is not None:
            out = open(fd, "w", closefd=False)  # noqa: SIM115 - must outlive the with-less fixture body
    except ImportError:
        pass
    faulthandler.dump_traceback_later(HARD_LIMIT + (SOAK.seconds if SOAK.on else 0), exit=True, file=out)
    yield
    faulthandler.cancel_dump_traceback_later()
