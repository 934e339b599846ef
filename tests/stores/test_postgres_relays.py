"""Several relays on one PostgreSQL outbox: exactly-once under concurrent
appends, share of the work, per-stream order, and takeover after a SIGKILL.

The multi-process tests drain ``OUTRELAY_PG_RELAY_EVENTS`` events (default
6,000; the issue's full size is 30,000) over 300 streams into two
destinations; every delivery is witnessed in a PostgreSQL table numbered by
a bigserial, which orders deliveries across processes.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from outrelay import Event, Outbox, Relay
from outrelay.core.config.config import OutrelayConfig, RelayConfig
from outrelay.transports.memory import MemoryConfig, MemoryTransport
from tests.stores.conftest import pg_admin_url, pg_url

ROOT = Path(__file__).resolve().parents[2]
EVENTS = int(os.environ.get("OUTRELAY_PG_RELAY_EVENTS", "6000"))
STREAMS = 300


@pytest.fixture
def outbox(pg_schema: str) -> Iterator[Outbox]:
    ob = Outbox.open(pg_url(pg_schema))
    yield ob
    ob.close()


async def _run_until(relay: Relay, done: callable, timeout: float) -> None:  # type: ignore[valid-type]
    task = asyncio.create_task(relay.run())
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline and not task.done():
        await asyncio.sleep(0.05)
    relay.stop()
    await task


class TestConcurrentAppends:
    async def test_hundreds_of_concurrent_transactions_delivered_exactly_once(self, outbox: Outbox) -> None:
        """Hundreds of overlapping app transactions (commits out of seq order) are each delivered exactly once."""
        per_worker, workers = 25, 12  # 300 transactions
        committed: list[list[str]] = []
        lock = threading.Lock()

        def app_worker(w: int) -> None:
            rnd = random.Random(w)
            with psycopg.connect(pg_admin_url()) as conn:
                for i in range(per_worker):
                    events = [
                        Event(type="t", stream=f"s{rnd.randrange(20)}", data={"w": w, "i": i, "k": k})
                        for k in range(rnd.randint(1, 3))
                    ]
                    rollback = rnd.random() < 0.1
                    with conn.transaction():
                        outbox.append(events, conn=conn)
                        time.sleep(rnd.uniform(0, 0.01))  # hold the seq while others commit
                        if rollback:
                            raise psycopg.Rollback()  # the application's transaction fails
                    if not rollback:
                        with lock:
                            committed.append([e.id for e in events])

        broker = MemoryTransport.broker("conc")
        relay = Relay(
            outbox,
            OutrelayConfig(relay=RelayConfig(poll_interval=0.05)),
            transports={"mem": MemoryTransport(MemoryConfig(broker="conc", dedupe=False))},
        )
        threads = [threading.Thread(target=app_worker, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        expected = lambda: sum(map(len, committed))  # noqa: E731
        alive = lambda: any(t.is_alive() for t in threads)  # noqa: E731
        await _run_until(relay, lambda: not alive() and len(broker.all()) >= expected(), timeout=60)
        for t in threads:
            t.join()
        got = [m.event.id for m in broker.all()]
        want = [i for ids in committed for i in ids]
        assert len(committed) > 200
        assert Counter(got) == Counter(want)  # every committed event once; nothing rolled back
        position = {eid: n for n, eid in enumerate(got)}
        for ids in committed:  # one transaction's events keep their order within their stream
            for stream_ids in _by_stream(outbox, ids).values():
                assert [position[i] for i in stream_ids] == sorted(position[i] for i in stream_ids)


class TestWakeUp:
    async def test_append_from_another_process_wakes_the_relay(self, outbox: Outbox, pg_schema: str) -> None:
        """An append committed elsewhere reaches the relay via NOTIFY long before its next poll."""
        broker = MemoryTransport.broker("wake")
        relay = Relay(
            outbox,
            OutrelayConfig(relay=RelayConfig(poll_interval=30)),
            transports={"mem": MemoryTransport(MemoryConfig(broker="wake"))},
        )
        task = asyncio.create_task(relay.run())
        try:
            await asyncio.sleep(1.0)  # relay idle, LISTENing, next poll in ~30 s
            other = Outbox.open(pg_url(pg_schema))  # another Outbox: no in-process wake-up
            try:
                started = time.monotonic()
                await asyncio.to_thread(other.append, Event(type="t", stream="s", data=1))
                while not broker.all() and time.monotonic() - started < 10:
                    await asyncio.sleep(0.02)
                latency = time.monotonic() - started
            finally:
                other.close()
        finally:
            relay.stop()
            await task
        assert len(broker.all()) == 1
        assert latency < 3.0


def _by_stream(outbox: Outbox, ids: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = defaultdict(list)
    stored = {e.id: e for e in outbox.store.events(limit=100_000)}
    for i in ids:
        out[stored[i].stream].append(i)
    return out


# -- several relay processes ------------------------------------------------------


def _prepare(outbox: Outbox, schema: str) -> None:
    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{schema}".received (n bigserial PRIMARY KEY, destination text, '
            "stream text, seq bigint, relay text)"
        )
    events = [Event(type="t", stream=f"s{i % STREAMS}", data={"i": i}) for i in range(EVENTS)]
    for i in range(0, EVENTS, 2000):
        outbox.append(events[i : i + 2000])


def _start(schema: str, name: str, logs: Path, lease: float) -> subprocess.Popen[bytes]:
    with open(logs / f"{name}.log", "wb") as log:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.stores._pg_relay_proc",
                pg_url(schema),
                name,
                schema,
                pg_admin_url(),
                str(lease),
            ],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _start_all(schema: str, names: tuple[str, ...], logs: Path, lease: float) -> dict[str, subprocess.Popen[bytes]]:
    """Start one relay process per name and let them go together, once each has said it is ready."""
    procs = {name: _start(schema, name, logs, lease) for name in names}
    deadline = time.monotonic() + 60
    for name, p in procs.items():
        while "ready\n" not in (logs / f"{name}.log").read_text(errors="replace"):
            if p.poll() is not None or time.monotonic() > deadline:
                for q in procs.values():
                    q.kill()
                pytest.fail(f"relay {name} did not get ready: {_log(logs, name)}")
            time.sleep(0.02)
    for p in procs.values():
        assert p.stdin is not None
        p.stdin.write(b"go\n")
        p.stdin.close()
    return procs


def _log(logs: Path, name: str) -> str:
    return (logs / f"{name}.log").read_text(errors="replace")[-3000:]


def _received(schema: str) -> list[tuple[str, str, int, str]]:
    with psycopg.connect(pg_admin_url()) as conn:
        return conn.execute(f'SELECT destination, stream, seq, relay FROM "{schema}".received ORDER BY n').fetchall()


def _count(schema: str) -> int:
    with psycopg.connect(pg_admin_url()) as conn:
        return int(conn.execute(f'SELECT count(*) FROM "{schema}".received').fetchone()[0])  # type: ignore[index]


def _check(outbox: Outbox, rows: list[tuple[str, str, int, str]]) -> dict[str, int]:
    """Every event reached both destinations; first deliveries per stream in seq order; the split by relay."""
    want: dict[str, list[int]] = defaultdict(list)
    for e in outbox.store.events(limit=EVENTS + 10):
        want[e.stream].append(e.sequence or 0)
    for dest in ("a", "b"):
        firsts: dict[str, list[int]] = defaultdict(list)
        seen: set[int] = set()
        for d, stream, seq, _relay in rows:
            if d == dest and seq not in seen:
                seen.add(seq)
                firsts[stream].append(seq)
        assert len(seen) == EVENTS, f"destination {dest}: {EVENTS - len(seen)} events missing"
        for stream, seqs in want.items():
            assert firsts[stream] == seqs, f"destination {dest}, stream {stream}: out of order"
    return dict(Counter(r[3] for r in rows))


def _finish(procs: dict[str, subprocess.Popen[bytes]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for name, p in procs.items():
        try:
            p.wait(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs.values():
                q.kill()
            pytest.fail(f"relay {name} did not finish within {timeout}s")


class TestSeveralRelays:
    def test_three_relays_share_the_work_in_order(self, outbox: Outbox, pg_schema: str, tmp_path: Path) -> None:
        """Three relay processes deliver every event once to each destination, in per-stream order, sharing work."""
        _prepare(outbox, pg_schema)
        procs = _start_all(pg_schema, ("r1", "r2", "r3"), tmp_path, 60)
        started = time.monotonic()
        _finish(procs, timeout=180)
        elapsed = time.monotonic() - started
        for name, p in procs.items():
            assert p.returncode == 0, f"relay {name} failed: {_log(tmp_path, name)}"
        rows = _received(pg_schema)
        split = _check(outbox, rows)
        print(
            f"\n3 relays, {EVENTS} events x 2 destinations in {elapsed:.1f}s; deliveries by relay: {split}; "
            f"duplicates: {len(rows) - 2 * EVENTS}"
        )
        assert len(rows) == 2 * EVENTS  # no crash and leases long enough: no duplicates
        assert len(split) == 3 and min(split.values()) >= 0.1 * len(rows), f"unfair split {split}"

    def test_killed_relay_is_taken_over_after_its_lease(self, outbox: Outbox, pg_schema: str, tmp_path: Path) -> None:
        """A relay SIGKILLed mid-drain loses nothing: the others take its lanes after the lease, in order."""
        _prepare(outbox, pg_schema)
        procs = _start_all(pg_schema, ("k1", "k2", "k3"), tmp_path, 2)
        deadline = time.monotonic() + 60
        while _count(pg_schema) < EVENTS // 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        procs["k1"].send_signal(signal.SIGKILL)
        killed_at = _count(pg_schema)
        _finish(procs, timeout=180)
        for name in ("k2", "k3"):
            assert procs[name].returncode == 0, _log(tmp_path, name)
        rows = _received(pg_schema)
        split = _check(outbox, rows)
        print(f"\nkilled k1 after {killed_at} deliveries; by relay: {split}; duplicates: {len(rows) - 2 * EVENTS}")
        assert split.get("k1", 0) > 0 and split.get("k2", 0) > 0 and split.get("k3", 0) > 0
