"""Cross-process wake-ups on SQLite, lease renewal under slow sends, and the memory bounds."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from outrelay import Event, EventError, Outbox, Relay, StoreError, hookimpl, parse_config
from outrelay.core.relay.routing import Router
from outrelay.core.stores import sqlite_watch
from outrelay.core.stores.base import InlineRefused, Settlement
from outrelay.core.stores.sqlite import SQLiteStore
from outrelay.transports.memory import MemoryTransport
from outrelay.transports.webhook.receiver import WebhookReceiver, WebhookRequest
from tests.transports.webhook_support import SECRET


def mem_config(tmp_path: Path, **relay: Any) -> Any:
    return parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 5.0, **relay},
            "destinations": {"mem": {"transport": "memory", "broker": "lat"}},
        }
    )


async def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.002)
    return predicate()


def count_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the commit watchers' checks (``CommitWatcher._look``) in ``[0]`` from now on."""
    checks = [0]
    original = sqlite_watch.CommitWatcher._look

    def counting(watcher: sqlite_watch.CommitWatcher) -> str:
        checks[0] += 1
        return original(watcher)

    monkeypatch.setattr(sqlite_watch.CommitWatcher, "_look", counting)
    return checks


class TestCrossProcessWakeUp:
    @pytest.mark.parametrize("inotify", [True, False], ids=["inotify", "polling"])
    async def test_append_on_another_connection_is_relayed_before_the_poll(
        self, tmp_path: Path, inotify: bool, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """An append committed through another connection reaches the broker in well under poll_interval (5 s)."""
        if not inotify:
            monkeypatch.setattr(sqlite_watch, "_inotify", lambda directory: None)
        MemoryTransport.broker("lat").clear()
        cfg = mem_config(tmp_path)
        relay = Relay(config=cfg)
        task = asyncio.create_task(relay.run())
        other = Outbox.open(cfg.outbox.url)  # not the relay's Outbox: no in-process wake-up
        try:
            await asyncio.sleep(0.3)  # the relay is idle, waiting out its 5 s poll
            latencies = []
            for i in range(5):
                await asyncio.to_thread(other.append, Event(type="t.x", stream="s", data={"i": i}))
                committed = time.monotonic()
                assert await wait_until(lambda n=i + 1: len(MemoryTransport.broker("lat").all()) == n, 3.0)
                latencies.append(time.monotonic() - committed)
                await asyncio.sleep(0.2)
            assert max(latencies) < 0.5, latencies
        finally:
            other.close()
            relay.stop()
            await task

    def test_watcher_ignores_writes_that_add_no_events(self, tmp_path: Path) -> None:
        """The commit watcher calls back for new events only, not for bookkeeping writes."""
        store = SQLiteStore(f"sqlite:///{tmp_path}/o.db")
        other = SQLiteStore(f"sqlite:///{tmp_path}/o.db")
        calls: list[str] = []
        got = threading.Event()
        stop = store.listen(lambda what: (calls.append(what), got.set()))
        try:
            for _ in range(5):
                other.record_error("d", "boom", time.time())
            time.sleep(0.3)
            assert calls == []
            other.append([Event(type="t.x", stream="s")])
            assert got.wait(2.0) and calls == ["appended"]
        finally:
            stop()
            store.close()
            other.close()

    def test_own_process_bookkeeping_costs_one_check_per_write(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A bookkeeping write of the relay's process (relaxed, as the relay's route, claim and settle)
        costs the watcher about one check, not a window of checks every few milliseconds; an append
        from another process is still seen at once."""
        checks = count_checks(monkeypatch)
        path = tmp_path / "o.db"
        store = SQLiteStore(f"sqlite:///{path}")
        got = threading.Event()
        stop = store.listen(lambda what: got.set())
        try:
            if not sqlite_watch._inotify(str(tmp_path)):
                pytest.skip("inotify is unavailable here: the watcher polls instead (covered above)")
            time.sleep(0.1)
            checks[0] = 0
            for _ in range(10):
                with store._tx(relaxed=True) as db:  # what the relay's settle commits
                    db.execute("UPDATE outrelay_meta SET value = value WHERE key = 'route_cursor'")
                time.sleep(0.02)
            time.sleep(sqlite_watch.HOT_WINDOW)
            # a window of checks every 1-5 ms after each write would make 100-500
            assert checks[0] <= 25, checks[0]
            assert not got.is_set()
            script = (
                "import sys; from outrelay import Event, Outbox; "
                "o = Outbox.open(sys.argv[1]); o.append(Event(type='t.x', stream='s')); o.close()"
            )
            subprocess.run([sys.executable, "-c", script, f"sqlite:///{path}"], check=True, timeout=60)
            assert got.wait(2.0)
        finally:
            stop()
            store.close()

    async def test_watch_in_the_relays_loop(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """With the relay's loop and inotify, the watch runs in that loop (no thread of its own) and calls
        back in the loop's thread for another connection's append; the store's own route, claim and
        settle run inline in that loop (as the relay runs them at a trickle) cost it no check at all
        (in a thread of its own it makes one per commit); it stops cleanly."""
        path = tmp_path / "o.db"
        if not sqlite_watch._inotify(str(tmp_path)):
            pytest.skip("inotify is unavailable here: the watcher runs in a polling thread (covered above)")
        checks = count_checks(monkeypatch)
        store = SQLiteStore(f"sqlite:///{path}")
        other = SQLiteStore(f"sqlite:///{path}")
        store.acquire_relay("me")
        loop = asyncio.get_running_loop()
        threads_before = {t.name for t in threading.enumerate()}
        calls: list[tuple[str, int]] = []
        got = asyncio.Event()

        def callback(what: str) -> None:
            calls.append((what, threading.get_ident()))
            got.set()

        stop = store.listen(callback, loop=loop)
        try:
            assert "outrelay-sqlite-watch" not in {t.name for t in threading.enumerate()} - threads_before
            for round_ in range(3):
                await asyncio.to_thread(other.append, [Event(type="t.x", stream=f"s{i}") for i in range(3)])
                await asyncio.wait_for(got.wait(), 2.0)
                assert calls == [("appended", threading.get_ident())]
                calls.clear()
                got.clear()
                await asyncio.sleep(sqlite_watch.HOT_WINDOW)  # the append's follow-up checks are over
                checks[0] = 0
                now = time.time()
                assert store.call_inline(partial(store.route, Router([], ["d"]), 100, now)) == 3
                claimed = store.call_inline(
                    partial(store.claim, "d", limit=10, per_lane=10, owner="me", lease_seconds=30, now=now)
                )
                assert len(claimed) == 3
                done = [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed]
                store.call_inline(partial(store.settle, "d", "me", done, now))
                await asyncio.sleep(sqlite_watch.HOT_WINDOW + 0.05)
                assert checks[0] == 0, f"round {round_}: {checks[0]} checks after the store's own commits"
                assert calls == []
        finally:
            stop()
            stop()  # idempotent
            store.close()
            other.close()

    async def test_a_locked_database_does_not_hold_the_relays_loop(self, tmp_path: Path) -> None:
        """While another connection holds the write lock for 0.5 s, the relay's store calls that find it
        locked leave the loop at once (run in the store's thread, which waits there), so the loop keeps
        ticking; an append once the lock is released is relayed."""
        MemoryTransport.broker("lat").clear()
        cfg = mem_config(tmp_path, poll_interval=0.05)
        relay = Relay(config=cfg)
        refused = 0
        real = relay.store.call_inline

        def call_inline(call: Any) -> Any:
            nonlocal refused
            try:
                return real(call)
            except InlineRefused:
                refused += 1
                raise

        relay.store.call_inline = call_inline  # type: ignore[method-assign]
        task = asyncio.create_task(relay.run())
        holder = sqlite3.connect(f"{tmp_path}/o.db", isolation_level=None, timeout=5)
        try:
            await asyncio.sleep(0.3)
            other = Outbox.open(cfg.outbox.url)
            holder.execute("BEGIN IMMEDIATE")
            gaps: list[float] = []
            last = time.monotonic()
            locked_until = last + 0.5
            while time.monotonic() < locked_until:
                await asyncio.sleep(0.005)
                now = time.monotonic()
                gaps.append(now - last)
                last = now
            holder.execute("COMMIT")
            assert refused >= 1  # the router's polls met the lock
            assert max(gaps) < 0.1, max(gaps)
            await asyncio.to_thread(other.append, Event(type="t.x", stream="s"))
            assert await wait_until(lambda: len(MemoryTransport.broker("lat").all()) == 1, 3.0)
            other.close()
        finally:
            holder.close()
            relay.stop()
            await task


class TestLeases:
    async def test_slow_receiver_gets_each_event_exactly_once(self, tmp_path: Path) -> None:
        """A receiver taking 3 s per request with 1 s leases gets exactly one POST per event (leases renewed)."""

        async def slow(request: WebhookRequest) -> int:
            await asyncio.sleep(3.0)
            return 204

        async with WebhookReceiver(secrets=SECRET, respond=slow) as rx:
            cfg = parse_config(
                {
                    "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
                    "relay": {"poll_interval": 0.05, "lease_seconds": 1},
                    "destinations": {
                        "hooks": {
                            "transport": "webhook",
                            "url": rx.url,
                            "secret": SECRET,
                            "allow_private_network": True,
                        }
                    },
                }
            )
            sent = [Event(type="t.x", stream=f"s{i % 5}", data={"i": i}) for i in range(10)]
            with Outbox.open(cfg.outbox.url) as outbox:
                outbox.append(sent)
            summary = await Relay(config=cfg).run(drain=True)
            ids = [r.headers["webhook-id"] for r in rx.requests]
            assert sorted(ids) == sorted(e.id for e in sent), f"{len(ids)} POSTs for {len(sent)} events"
            assert summary.remaining == 0


class TestMemoryBounds:
    def test_append_refuses_an_event_over_max_event_bytes(self, tmp_path: Path) -> None:
        """An event larger than max_event_bytes raises EventError and nothing of its batch is committed."""
        with Outbox.open(f"sqlite:///{tmp_path}/o.db", max_event_bytes=1000) as outbox:
            small = Event(type="t.x", stream="s", data=b"x" * 1000)
            big = Event(type="t.x", stream="s", data=b"x" * 1001)
            with pytest.raises(EventError, match=r"1,001 bytes, over the outbox's max_event_bytes 1,000"):
                outbox.append([small, big])
            assert outbox.store.events() == []
            outbox.append(small)

    def test_default_limit_and_no_limit(self, tmp_path: Path) -> None:
        """The default refuses 9 MiB; max_event_bytes=None accepts it."""
        nine = Event(type="t.x", stream="s", data=b"x" * (9 * 1024 * 1024))
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox, pytest.raises(EventError):
            outbox.append(nine)
        with Outbox.open(f"sqlite:///{tmp_path}/o.db", max_event_bytes=None) as outbox:
            outbox.append(nine)

    def test_config_sets_the_limit(self) -> None:
        """[outbox] max_event_bytes and the relay byte budgets are validated config fields."""
        cfg = parse_config(
            {"outbox": {"max_event_bytes": 10}, "relay": {"max_batch_bytes": 5, "max_in_flight_bytes": 7}}
        )
        assert cfg.outbox.max_event_bytes == 10
        assert (cfg.relay.max_batch_bytes, cfg.relay.max_in_flight_bytes) == (5, 7)

    async def test_relay_claims_within_the_byte_budgets(self, tmp_path: Path) -> None:
        """Batches stay within max_batch_bytes and the bytes in flight within max_in_flight_bytes (+1 event)."""
        MemoryTransport.broker("lat").clear()
        cfg = mem_config(tmp_path, max_batch_bytes=250_000, max_in_flight_bytes=600_000, poll_interval=0.05)
        with Outbox.open(cfg.outbox.url) as outbox:
            outbox.append([Event(type="t.x", stream=f"s{i % 8}", data=b"x" * 100_000) for i in range(40)])
        relay = Relay(config=cfg)
        batches: list[int] = []
        peak = 0

        class Probe:
            @hookimpl
            def outrelay_batch_settled(self, messages: list[Any]) -> None:
                batches.append(sum(len(m.event.data) for m in messages))

        relay.registry.pm.register(probe := Probe())

        async def sample() -> None:
            nonlocal peak
            while True:
                peak = max(peak, relay.budget.used)
                await asyncio.sleep(0)

        sampler = asyncio.create_task(sample())
        try:
            summary = await relay.run(drain=True)
        finally:
            sampler.cancel()
            relay.registry.pm.unregister(probe)
        assert summary.remaining == 0 and sum(batches) == 4_000_000
        assert max(batches) <= 250_000 and 0 < peak <= 600_000


class TestLockFile:
    def test_unwritable_lock_file_is_one_store_error(self, tmp_path: Path) -> None:
        """A relay lock file that cannot be created is a one-line StoreError naming it, not an OSError."""
        store = SQLiteStore(f"sqlite:///{tmp_path}/o.db")
        (tmp_path / "o.db.relay-lock").mkdir()  # os.open(O_RDWR) on a directory fails like a full disk would
        try:
            with pytest.raises(StoreError, match=r"cannot create the relay lock file .*o\.db\.relay-lock") as info:
                store.acquire_relay("me")
            assert "\n" not in str(info.value)
        finally:
            store.close()
