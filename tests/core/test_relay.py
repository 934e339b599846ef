"""The relay engine, on SQLite with the in-memory transport."""

from __future__ import annotations

import asyncio
import gc
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, ClassVar

import pytest

from outrelay import Event, Outbox, Relay, StoreLockedError, UsageError, hookimpl, parse_config
from outrelay.transports.memory import MemoryTransport

FAST = {"initial_delay": 0.01, "max_delay": 0.05, "jitter": 0.0}


def config(tmp_path: Path, destinations: dict[str, Any] | None = None, **extra: Any) -> Any:
    dests = destinations or {"mem": {"transport": "memory", "broker": "b", "retry": FAST}}
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": dests,
            **extra,
        }
    )


def events(n: int, streams: int, type_: str = "workflow.step") -> list[Event]:
    return [Event(type=type_, stream=f"s{i % streams}", data={"i": i}) for i in range(n)]


def per_stream(broker_name: str = "b") -> dict[str, list[int]]:
    out: dict[str, list[int]] = defaultdict(list)
    for m in MemoryTransport.broker(broker_name).all():
        out[m.key].append(m.event.json()["i"])
    return out


def assert_ordered(seen: dict[str, list[int]]) -> None:
    for stream, items in seen.items():
        assert items == sorted(items), f"stream {stream} out of order"


class TestDelivery:
    async def test_all_delivered_in_order(self, tmp_path: Path) -> None:
        """Every appended event is delivered once, in order per stream."""
        cfg = config(tmp_path)
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(events(3000, 30))
        summary = await Relay(outbox, cfg).run(drain=True)
        seen = per_stream()
        assert sum(map(len, seen.values())) == 3000 and summary.remaining == 0
        assert_ordered(seen)
        assert summary.counts["mem"]["delivered"] == 3000

    @pytest.mark.parametrize("threshold", [5000, None])
    async def test_gc_threshold_applies_while_running(self, tmp_path: Path, threshold: int | None) -> None:
        """relay.gc_threshold sets the collector's first threshold for the run only; None leaves it alone."""
        before = gc.get_threshold()
        seen: list[tuple[int, int, int]] = []
        cfg = config(tmp_path, relay={"poll_interval": 0.05, "gc_threshold": threshold})
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(events(10, 2))
        relay = Relay(outbox, cfg)

        class Probe:
            @hookimpl
            def outrelay_batch_settled(self) -> None:
                seen.append(gc.get_threshold())

        probe = Probe()
        relay.registry.pm.register(probe)
        try:
            await relay.run(drain=True)
        finally:
            relay.registry.pm.unregister(probe)
        assert seen and all(t == ((threshold, *before[1:]) if threshold else before) for t in seen)
        assert gc.get_threshold() == before

    async def test_transient_failures_retried_in_order(self, tmp_path: Path) -> None:
        """Retryable failures are retried with backoff and never reorder a stream."""
        cfg = config(tmp_path)
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(events(500, 10))
        MemoryTransport.broker("b").fail_next = 40
        summary = await Relay(outbox, cfg).run(drain=True)
        seen = per_stream()
        assert sum(map(len, seen.values())) == 500
        assert_ordered(seen)
        assert summary.counts["mem"]["retried"] > 0

    async def test_rejected_dead_lettered_stream_continues(self, tmp_path: Path) -> None:
        """A rejected event goes to the DLQ while its stream's later events and other streams continue."""
        cfg = config(
            tmp_path, {"mem": {"transport": "memory", "broker": "b", "reject_types": ["bad.type"], "retry": FAST}}
        )
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(
            [Event(type="ok", stream="s1", data={"i": 0}), Event(type="bad.type", stream="s1", data={"i": 1})]
        )
        outbox.append([Event(type="ok", stream="s1", data={"i": 2}), Event(type="ok", stream="s2", data={"i": 3})])
        summary = await Relay(outbox, cfg).run(drain=True)
        assert per_stream() == {"s1": [0, 2], "s2": [3]}
        dead = outbox.store.dead_letters()
        assert [(d.event.type, d.destination, d.state) for d in dead] == [("bad.type", "mem", "dead")]
        assert "rejected" in dead[0].reason and dead[0].attempts == 1
        assert summary.dead_lettered == 1

    async def test_exhausted_retries_dead_letter(self, tmp_path: Path) -> None:
        """After max_attempts retryable failures the event is dead-lettered with the attempt count."""
        cfg = config(tmp_path, {"mem": {"transport": "memory", "broker": "b", "retry": {**FAST, "max_attempts": 3}}})
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(Event(type="t", stream="s", data={"i": 0}))
        MemoryTransport.broker("b").fail_next = 3
        await Relay(outbox, cfg).run(drain=True)
        (dl,) = outbox.store.dead_letters()
        assert dl.attempts == 3 and "exhausted after 3 attempts" in dl.reason
        assert dl.first_attempt_at is not None and dl.failed_at >= dl.first_attempt_at

    async def test_park_policy_stops_stream_until_replay(self, tmp_path: Path) -> None:
        """With on_exhausted=park a failing event stops its stream (others go on) until an operator replays it."""
        cfg = config(
            tmp_path,
            {"mem": {"transport": "memory", "broker": "b", "reject_types": ["bad"], "retry": FAST}},
            routes=[{"destinations": ["mem"], "on_exhausted": "park"}],
        )
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(
            [
                Event(type="ok", stream="s1", data={"i": 0}),
                Event(type="bad", stream="s1", data={"i": 1}),
                Event(type="ok", stream="s1", data={"i": 2}),
                Event(type="ok", stream="s2", data={"i": 3}),
            ]
        )
        summary = await Relay(outbox, cfg).run(drain=True)
        assert per_stream() == {"s1": [0], "s2": [3]}
        assert summary.remaining == 2
        (dl,) = outbox.store.dead_letters()
        assert dl.state == "parked"
        (status,) = outbox.store.status(["mem"], time.time())
        assert status.parked_streams == 1
        # the operator purges the poison event: the stream resumes with the next one
        assert outbox.store.purge_dead([dl.id], destination=None) == 1
        await Relay(outbox, cfg).run(drain=True)
        assert per_stream() == {"s1": [0, 2], "s2": [3]}

    async def test_dlq_replay_redelivers(self, tmp_path: Path) -> None:
        """Replaying a dead letter delivers the event again."""
        cfg = config(tmp_path, {"mem": {"transport": "memory", "broker": "b", "retry": {**FAST, "max_attempts": 1}}})
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(Event(type="t", stream="s", data={"i": 9}))
        MemoryTransport.broker("b").fail_next = 1
        await Relay(outbox, cfg).run(drain=True)
        (dl,) = outbox.store.dead_letters()
        assert outbox.store.replay_dead([dl.id], destination=None, now=time.time()) == 1
        assert outbox.store.dead_letters() == []
        await Relay(outbox, cfg).run(drain=True)
        assert per_stream() == {"s": [9]}

    async def test_disable_destination_keeps_events(self, tmp_path: Path) -> None:
        """A destination disabled by the operator keeps its events pending until re-enabled."""
        cfg = config(tmp_path)
        outbox = Outbox.open(cfg.outbox.url)
        outbox.store.set_disabled("mem", "maintenance", time.time())
        outbox.append(events(10, 2))
        summary = await Relay(outbox, cfg).run(drain=True)
        assert summary.remaining == 10 and per_stream() == {}
        outbox.store.set_disabled("mem", None, time.time())
        summary = await Relay(outbox, cfg).run(drain=True)
        assert summary.remaining == 0 and sum(map(len, per_stream().values())) == 10


class TestIndependence:
    async def test_failing_destination_does_not_delay_another(self, tmp_path: Path) -> None:
        """A destination whose broker is down never delays a healthy one."""
        cfg = config(
            tmp_path,
            {
                "good": {"transport": "memory", "broker": "good", "retry": FAST},
                "down": {"transport": "memory", "broker": "down", "retry": FAST},
            },
        )
        MemoryTransport.broker("down").down = True
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(events(200, 5))
        relay = Relay(outbox, cfg)
        task = asyncio.create_task(relay.run())
        deadline = time.monotonic() + 10
        while len(MemoryTransport.broker("good").all()) < 200 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        relay.stop()
        summary = await task
        assert len(MemoryTransport.broker("good").all()) == 200
        assert {s.destination: s.pending for s in summary.status} == {"good": 0, "down": 200}
        assert "down" in (next(s for s in summary.status if s.destination == "down").last_error or "")


class TestLifecycle:
    async def test_wakes_on_append(self, tmp_path: Path) -> None:
        """An append in the same process is delivered without waiting for a poll."""
        cfg = parse_config(
            {
                "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
                "relay": {"poll_interval": 30},
                "destinations": {"mem": {"transport": "memory", "broker": "b"}},
            }
        )
        outbox = Outbox.open(cfg.outbox.url)
        relay = Relay(outbox, cfg)
        task = asyncio.create_task(relay.run())
        await asyncio.sleep(0.2)
        started = time.monotonic()
        outbox.append(Event(type="t", stream="s", data={"i": 1}))
        while not MemoryTransport.broker("b").all() and time.monotonic() - started < 5:
            await asyncio.sleep(0.005)
        latency = time.monotonic() - started
        relay.stop()
        await task
        assert MemoryTransport.broker("b").all() and latency < 5

    async def test_append_in_caller_transaction(self, tmp_path: Path) -> None:
        """Events appended in the caller's sqlite3 transaction are delivered after commit, never after rollback."""
        import sqlite3

        cfg = config(tmp_path)
        outbox = Outbox.open(cfg.outbox.url)
        conn = sqlite3.connect(f"{tmp_path}/o.db")
        conn.execute("CREATE TABLE orders (id INTEGER)")
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (1)")
        outbox.append(Event(type="order.placed", stream="o1", data={"i": 1}), conn=conn)
        conn.commit()
        conn.execute("INSERT INTO orders VALUES (2)")
        outbox.append(Event(type="order.placed", stream="o2", data={"i": 2}), conn=conn)
        conn.rollback()
        await Relay(outbox, cfg).run(drain=True)
        assert per_stream() == {"o1": [1]}
        assert conn.execute("SELECT COUNT(*) FROM orders").fetchone()[0] == 1

    async def test_stop_releases_in_flight(self, tmp_path: Path) -> None:
        """Stopping mid-send finishes or releases in-flight work; a new relay delivers the rest."""
        cfg = config(
            tmp_path,
            {"mem": {"transport": "memory", "broker": "b", "latency": 0.05, "batch_size": 20}},
            relay={"poll_interval": 0.05, "shutdown_grace": 0.01},
        )
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(events(400, 20))
        relay = Relay(outbox, cfg)
        task = asyncio.create_task(relay.run())
        await asyncio.sleep(0.15)
        relay.stop()
        first = await task
        assert first.remaining > 0
        await Relay(outbox, cfg).run(drain=True)
        seen = per_stream()
        assert {i for items in seen.values() for i in items} == set(range(400))
        assert_ordered({k: list(dict.fromkeys(v)) for k, v in seen.items()})

    async def test_one_relay_per_sqlite_outbox(self, tmp_path: Path) -> None:
        """A second relay on the same SQLite outbox is refused with a clear error."""
        cfg = config(tmp_path)
        relay = Relay(Outbox.open(cfg.outbox.url), cfg)
        task = asyncio.create_task(relay.run())
        await asyncio.sleep(0.1)
        gc_before = gc.get_threshold()
        second = Relay(Outbox.open(cfg.outbox.url), cfg)
        with pytest.raises(StoreLockedError, match="SQLite serves one relay"):
            await second.run(drain=True)
        assert gc.get_threshold() == gc_before  # the refused run changed nothing
        relay.stop()
        await task
        second.outbox.append(events(5, 1))
        summary = await second.run(drain=True)  # once the first has stopped, the same object may run
        assert summary.counts["mem"]["delivered"] == 5

    async def test_run_twice_is_misuse(self, tmp_path: Path) -> None:
        """Running one Relay object twice at once raises UsageError."""
        cfg = config(tmp_path)
        relay = Relay(Outbox.open(cfg.outbox.url), cfg)
        task = asyncio.create_task(relay.run())
        await asyncio.sleep(0.05)
        with pytest.raises(UsageError):
            await relay.run()
        relay.stop()
        await task

    async def test_broker_down_at_start_then_up(self, tmp_path: Path) -> None:
        """A relay started while the broker is down delivers everything once it comes up."""
        cfg = config(tmp_path)
        MemoryTransport.broker("b").down = True
        outbox = Outbox.open(cfg.outbox.url)
        outbox.append(events(50, 5))
        relay = Relay(outbox, cfg)
        task = asyncio.create_task(relay.run())
        await asyncio.sleep(0.5)
        MemoryTransport.broker("b").down = False
        deadline = time.monotonic() + 10
        while len(MemoryTransport.broker("b").all()) < 50 and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        relay.stop()
        await task
        assert len(MemoryTransport.broker("b").all()) == 50


class TestAppend:
    def test_sequences_contiguous_and_returned(self, tmp_path: Path) -> None:
        """A batch append returns its ids and the store assigns increasing sequence numbers in order."""
        outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
        first = outbox.append(events(5, 2))
        stored = outbox.store.append(events(3, 1))
        assert [e.sequence for e in stored] == [6, 7, 8]
        assert [e.id for e in outbox.store.events(limit=5)] == first

    def test_autocommit_connection(self, tmp_path: Path) -> None:
        """On an autocommit sqlite3 connection the append commits a transaction of its own."""
        import sqlite3

        outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
        conn = sqlite3.connect(f"{tmp_path}/o.db", isolation_level=None)
        outbox.append(events(3, 1), conn=conn)
        assert not conn.in_transaction
        assert len(outbox.store.events()) == 3

    def test_duplicate_id_rejected(self, tmp_path: Path) -> None:
        """Appending an id that is already in the outbox raises EventError and appends nothing of the batch."""
        from outrelay import EventError

        outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
        e = Event(type="t", stream="s")
        outbox.append(e)
        with pytest.raises(EventError):
            outbox.append([Event(type="t", stream="s"), e])
        assert len(outbox.store.events()) == 1


class TestStoreOutage:
    async def test_relay_survives_transient_store_errors(self, tmp_path: Path) -> None:
        """A database that fails for a while (locked, restarting) delays delivery but loses nothing."""
        from outrelay import StoreError
        from outrelay.core.stores.sqlite import SQLiteStore

        class Flaky(SQLiteStore):
            failures: ClassVar[dict[str, int]] = {"claim": 2, "route": 2}

            def claim(self, destination: str, **kw: Any) -> Any:
                if self.failures["claim"] > 0:
                    self.failures["claim"] -= 1
                    raise StoreError("database is locked (injected)")
                return super().claim(destination, **kw)

            def route(self, router: Any, limit: int, now: float) -> int:
                if self.failures["route"] > 0:
                    self.failures["route"] -= 1
                    raise StoreError("database is locked (injected)")
                return super().route(router, limit, now)

        cfg = config(tmp_path)
        store = Flaky(cfg.outbox.url)
        outbox = Outbox(store)
        outbox.append(events(100, 5))
        summary = await Relay(outbox, cfg).run(drain=True)
        assert summary.remaining == 0 and store.failures == {"claim": 0, "route": 0}
        seen = per_stream()
        assert sum(map(len, seen.values())) == 100
        assert_ordered(seen)
