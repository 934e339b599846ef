"""Chaos: a relay (SQLite outbox → broker) through network faults and broker kills, never restarted.

Every run appends 2,000 events (5,000 for kills) over 20 streams and fires its
faults at fixed delivered counts (see ``_harness.py``); it passes when the relay finished by
itself within the bound, a reader got every event back, and each stream's
first deliveries are in append order. RabbitMQ has no kill test: it runs on
the shared broker (see ``_rigs.py``). ``OUTRELAY_CHAOS_SOAK=1`` adds a soak of
random, seeded faults per broker.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tests.chaos._harness import KILL_EVENTS, SOAK, Rig, fixed_kills, fixed_proxy_faults, random_faults, run_chaos

ALL = ["kafka", "nats", "rabbitmq", "redis", "webhook"]
KILLABLE = ["kafka", "nats", "redis", "webhook"]  # RabbitMQ: the shared broker, not ours to kill


@pytest.fixture
def rig(request: pytest.FixtureRequest) -> Rig:
    """The rig named by the test's parameter (see ``_rigs.py``)."""
    got: Rig = request.getfixturevalue(f"{request.param}_rig")
    return got


@pytest.mark.parametrize("rig", ALL, indirect=True)
async def test_proxy_faults(tmp_path: Path, rig: Rig) -> None:
    """Added latency, a cut and an RST each in the middle of a request, then a black hole longer than the
    attempt deadline: the relay recovers by itself, nothing is lost, every stream's first deliveries are in order."""
    outcome = await run_chaos(tmp_path, rig, fixed_proxy_faults(rig.proxy))
    print(outcome.report())
    outcome.check()
    assert rig.proxy.stats["cuts"] >= 1 and rig.proxy.stats["resets"] >= 1


@pytest.mark.parametrize("rig", KILLABLE, indirect=True)
async def test_broker_kill(tmp_path: Path, rig: Rig) -> None:
    """kill -9 of the broker mid-run, twice (down 0.5 s, then 3 s), restarted on the same port and storage:
    the relay resumes by itself, nothing is lost, every stream's first deliveries are in order."""
    outcome = await run_chaos(tmp_path, rig, fixed_kills(rig), events=KILL_EVENTS, direct=True)
    print(outcome.report())
    outcome.check()


@pytest.mark.skipif(not SOAK.on, reason="a long soak: set OUTRELAY_CHAOS_SOAK=1 (see tests/chaos/_harness.py)")
@pytest.mark.parametrize("rig", ALL, indirect=True)
async def test_soak(tmp_path: Path, rig: Rig) -> None:
    """Many random faults (every kind the rig has, seeded) over a long run: nothing lost, first deliveries in order."""
    print(f"chaos soak seed {SOAK.seed} (OUTRELAY_CHAOS_SEED={SOAK.seed} replays it)")
    faults = random_faults(rig, random.Random(f"{SOAK.seed}-{rig.name}"), SOAK.faults, SOAK.events)
    outcome = await run_chaos(tmp_path, rig, faults, events=SOAK.events, limit=SOAK.seconds, seed=SOAK.seed)
    print(outcome.report())
    outcome.check()
