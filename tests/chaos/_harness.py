"""Drive a relay (SQLite outbox → one destination) through faults and check what arrived.

A :class:`Rig` is one destination behind a fault-injecting :class:`TcpProxy`
(and, where the broker can be run privately, a kill -9 + restart of it) plus a
way to read back everything the broker holds. :func:`run_chaos` appends the
events, starts the relay once and fires each :class:`Fault` when the
destination has delivered a given number of events; the relay is never
restarted, so finishing at all proves it recovers by itself. The run is
bounded by ``limit`` seconds: a stuck relay fails with its counts, last error
and the faults fired so far. :meth:`Outcome.check` then demands that every
event was read back and that each stream's *first* deliveries are in append
order (redeliveries after a fault are allowed: at-least-once).

``OUTRELAY_CHAOS_SOAK=1`` turns on the soak tests: ``OUTRELAY_CHAOS_SOAK_FAULTS``
random faults (default 30) over ``OUTRELAY_CHAOS_SOAK_EVENTS`` events (default
20,000), seeded by ``OUTRELAY_CHAOS_SEED`` (default: random); every failure
message carries the seed, so ``OUTRELAY_CHAOS_SEED=<seed>`` replays the schedule.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from outrelay import Event, Outbox, Relay, RunSummary, parse_config
from tests.peers.proxy import TcpProxy

__all__ = ["SOAK", "Fault", "Outcome", "Rig", "fixed_kills", "fixed_proxy_faults", "random_faults", "run_chaos"]


@dataclasses.dataclass(frozen=True)
class Soak:
    """The soak settings read from the environment (see the module docstring)."""

    on: bool
    events: int
    faults: int
    seed: int
    seconds: float


def _soak_from_env() -> Soak:
    env = os.environ.get
    return Soak(
        on=env("OUTRELAY_CHAOS_SOAK", "") not in ("", "0", "false", "no"),
        events=int(env("OUTRELAY_CHAOS_SOAK_EVENTS", "20000")),
        faults=int(env("OUTRELAY_CHAOS_SOAK_FAULTS", "30")),
        seed=int(env("OUTRELAY_CHAOS_SEED") or random.SystemRandom().randrange(2**32)),
        seconds=float(env("OUTRELAY_CHAOS_SOAK_SECONDS", "900")),
    )


SOAK = _soak_from_env()

#: relay settings for every chaos run: short leases, quick polling, a bounded shutdown
RELAY = {"poll_interval": 0.05, "lease_seconds": 3, "shutdown_grace": 2, "drain_retry_bound": 5}
#: destination settings: an attempt deadline a black hole outlasts, and a fast retry policy that never gives up
DESTINATION = {
    "batch_size": 100,
    "per_stream": 20,
    "attempt_timeout": 2.5,
    "retry": {"initial_delay": 0.05, "max_delay": 0.5, "max_attempts": 10_000},
}
#: events of a kill run (more than the 2,000 of a proxy run: see :func:`fixed_kills`)
KILL_EVENTS = 5000
#: how long a black hole lasts (longer than ``attempt_timeout``, so the attempt in flight fails)
BLACK_HOLE = 3.5


@dataclasses.dataclass
class Rig:
    """One destination behind ``proxy``: its relay options, a reader of everything it holds
    (``(event id, stream)`` in broker order, including redeliveries) and, where the broker is
    our own process, ``kill_restart(down_seconds)`` and the option overrides that bypass the
    proxy (``direct``: a killed broker then refuses connections, as it would without a proxy)."""

    name: str
    options: dict[str, Any]
    proxy: TcpProxy
    read_back: Callable[[int], Awaitable[list[tuple[str, str]]]]
    kill_restart: Callable[[float], Awaitable[None]] | None = None
    direct: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Fault:
    """A fault fired once the destination delivered ``at`` events; ``fire(delivered)`` returns
    when the fault is over (``delivered()`` reads the current count)."""

    at: int
    name: str
    fire: Callable[[Callable[[], int]], Awaitable[None]]


@dataclasses.dataclass
class Outcome:
    """What one chaos run sent, what the reader got, and which faults fired when."""

    rig: str
    sent: list[Event]
    got: list[tuple[str, str]]
    summary: RunSummary
    fired: list[str]
    seed: int | None
    elapsed: float

    def context(self) -> str:
        seed = f"; seed {self.seed} (OUTRELAY_CHAOS_SEED={self.seed} replays it)" if self.seed is not None else ""
        return f"{self.rig}: faults fired {self.fired}{seed}"

    @property
    def duplicates(self) -> int:
        return len(self.got) - len({i for i, _ in self.got})

    def check(self) -> None:
        """Nothing lost, nothing dead-lettered, every stream's first deliveries in append order."""
        ctx = self.context()
        assert self.summary.dead_lettered == 0, f"{self.summary.dead_lettered} events dead-lettered ({ctx})"
        assert self.summary.remaining == 0, f"{self.summary.remaining} deliveries still pending ({ctx})"
        seen = {i for i, _ in self.got}
        missing = [e.id for e in self.sent if e.id not in seen]
        assert not missing, f"{len(missing)} of {len(self.sent)} events never arrived, e.g. {missing[:3]} ({ctx})"
        want: dict[str, list[str]] = defaultdict(list)
        for e in self.sent:
            want[e.stream].append(e.id)
        first: dict[str, list[str]] = defaultdict(list)
        once: set[str] = set()
        for event_id, stream in self.got:
            if event_id not in once:
                once.add(event_id)
                first[stream].append(event_id)
        for stream, ids in want.items():
            got = first[stream]
            if got != ids:
                at = next(i for i, (a, b) in enumerate(zip(got, ids, strict=False)) if a != b)
                raise AssertionError(
                    f"stream {stream} out of order at its event #{at}: got {got[at]}, expected {ids[at]} ({ctx})"
                )

    def report(self) -> str:
        return (
            f"{self.rig}: {len(self.sent)} events in {self.elapsed:.1f}s, {self.duplicates} redelivered, "
            f"{self.summary.counts['d']['retried']} retries; faults: {', '.join(self.fired)}"
        )


async def run_chaos(
    tmp_path: Path,
    rig: Rig,
    faults: Sequence[Fault],
    *,
    events: int = 2000,
    streams: int = 20,
    limit: float = 60.0,
    seed: int | None = None,
    direct: bool = False,
) -> Outcome:
    """Relay ``events`` over ``streams`` streams to ``rig`` while ``faults`` fire (in order), then read back
    (``direct``: past the proxy, see :class:`Rig`).

    :raises AssertionError: the relay stopped, or did not deliver everything within ``limit`` seconds,
        or a fault point was never reached (the relay finished too early to test anything).
    """
    url = f"sqlite:///{tmp_path}/chaos.db"
    outbox = Outbox.open(url)
    sent = [Event(type="chaos.test", stream=f"s{i % streams}", data={"i": i}) for i in range(events)]
    outbox.append(sent)
    destination = {**DESTINATION, **rig.options, **(rig.direct if direct else {})}
    cfg = parse_config({"outbox": {"url": url}, "relay": RELAY, "destinations": {"d": destination}})
    relay = Relay(outbox, cfg)
    started = time.monotonic()
    task = asyncio.create_task(relay.run())
    fired: list[str] = []

    def delivered() -> int:
        worker = relay.workers.get("d")
        return 0 if worker is None else worker.counts["delivered"]

    def state() -> str:
        worker = relay.workers.get("d")
        counts = None if worker is None else worker.counts
        error = None if worker is None else worker.last_error
        return f"{counts}, last error {error!r}; faults fired {fired}" + (f"; seed {seed}" if seed is not None else "")

    async def until(count: int) -> None:
        while delivered() < count:
            assert not task.done(), f"the relay stopped by itself: {state()}"
            await asyncio.sleep(0.002)

    try:
        async with asyncio.timeout(limit):
            for fault in faults:
                await until(fault.at)
                at = delivered()
                if at >= events and seed is not None:  # a soak's faults may bunch up past the end
                    fired.append(f"{len(faults) - len(fired)} late faults skipped")
                    break
                assert at < events, f"the relay finished before fault {fault.name!r} (at {fault.at}): {state()}"
                fault_started = time.monotonic()
                await fault.fire(delivered)
                fired.append(f"{fault.name}@{at} ({time.monotonic() - fault_started:.1f}s)")
            await until(events)
    except TimeoutError:
        raise AssertionError(f"{rig.name}: relay stuck after {limit:g}s: {state()}") from None
    finally:
        relay.stop()
        summary = await asyncio.wait_for(task, 30)
        outbox.close()
    elapsed = time.monotonic() - started
    rig.proxy.latency = 0.0
    rig.proxy.release()
    got = await asyncio.wait_for(rig.read_back(events), 60)
    return Outcome(rig.name, sent, got, summary, fired, seed, elapsed)


# -- faults ------------------------------------------------------------------------


def cut_mid_batch(at: int, proxy: TcpProxy, nbytes: int, *, rst: bool = False) -> Fault:
    """Cut (``rst``: reset) every connection once ``nbytes`` more bytes went to the broker: half a request arrives."""

    async def fire(delivered: Callable[[], int]) -> None:
        proxy.cut_after(nbytes, rst=rst)
        deadline = time.monotonic() + 20
        while proxy.armed:
            assert time.monotonic() < deadline, f"no {nbytes} bytes went to the broker within 20 s to cut"
            await asyncio.sleep(0.002)

    return Fault(at, f"{'reset' if rst else 'cut'}-mid-batch", fire)


def black_hole(at: int, proxy: TcpProxy, seconds: float = BLACK_HOLE) -> Fault:
    """Nothing forwarded or answered for ``seconds`` (longer than the attempt deadline)."""

    async def fire(delivered: Callable[[], int]) -> None:
        await proxy.black_hole(seconds)

    return Fault(at, "black-hole", fire)


def latency(at: int, proxy: TcpProxy, seconds: float, span: int) -> Fault:
    """``seconds`` more latency each way while the next ``span`` events are delivered (at most 20 s)."""

    async def fire(delivered: Callable[[], int]) -> None:
        proxy.latency = seconds
        try:
            goal, deadline = delivered() + span, time.monotonic() + 20
            while delivered() < goal and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
        finally:
            proxy.latency = 0.0

    return Fault(at, "latency", fire)


def kill(at: int, rig: Rig, down: float) -> Fault:
    """kill -9 of the broker, restarted on the same port and storage ``down`` seconds later."""
    assert rig.kill_restart is not None
    kill_restart = rig.kill_restart

    async def fire(delivered: Callable[[], int]) -> None:
        await kill_restart(down)

    return Fault(at, "kill-9", fire)


def fixed_proxy_faults(proxy: TcpProxy, events: int = 2000) -> list[Fault]:
    """The CI schedule: latency, a cut and a reset in the middle of a request, then a black hole."""
    return [
        latency(events // 10, proxy, 0.02, events // 6),
        cut_mid_batch(events * 3 // 10, proxy, 3000),
        cut_mid_batch(events * 5 // 10, proxy, 5000, rst=True),
        black_hole(events * 7 // 10, proxy),
    ]


def fixed_kills(rig: Rig, events: int = KILL_EVENTS) -> list[Fault]:
    """The CI schedule: two kill -9 + restarts, one short, one longer than the attempt deadline
    (far apart: a relay may deliver ~2,000 events while a broker restarts and settles)."""
    return [kill(events // 10, rig, 0.5), kill(events // 2, rig, 3.0)]


def random_faults(rig: Rig, rng: random.Random, count: int, events: int) -> list[Fault]:
    """``count`` faults of every kind the rig supports at random (sorted) points, random sizes."""
    points = sorted(rng.sample(range(events // 50, events * 95 // 100), count))
    kinds = ["cut", "reset", "black-hole", "latency"] + (["kill"] if rig.kill_restart is not None else [])
    out: list[Fault] = []
    for at in points:
        kind = rng.choice(kinds)
        if kind in ("cut", "reset"):
            out.append(cut_mid_batch(at, rig.proxy, rng.randrange(1, 20_000), rst=kind == "reset"))
        elif kind == "black-hole":
            out.append(black_hole(at, rig.proxy, rng.uniform(0.2, 2 * BLACK_HOLE)))
        elif kind == "latency":
            out.append(latency(at, rig.proxy, rng.uniform(0.001, 0.05), rng.randrange(10, 500)))
        else:
            out.append(kill(at, rig, rng.uniform(0.0, 4.0)))
    return out
