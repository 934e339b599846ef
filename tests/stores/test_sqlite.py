"""SQLite-only behaviour of the embedded outbox: durability settings and migrations."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import pytest

from outrelay import Event
from outrelay.core.relay.routing import Router
from outrelay.core.stores.base import Settlement
from outrelay.core.stores.sqlite import SQLiteStore
from outrelay.core.stores.sqlite_schema import MIGRATIONS


def _synchronous(store: SQLiteStore) -> int:
    return int(store._db.execute("PRAGMA synchronous").fetchone()[0])


def test_relay_bookkeeping_is_relaxed_but_appends_stay_durable(tmp_path: Path) -> None:
    """Route, claim and settle commit without fsync (synchronous=NORMAL, set once for a run of
    them); an append on the same connection afterwards commits with FULL again — also after a
    failed transaction."""
    store = SQLiteStore(f"sqlite:///{tmp_path}/o.db")
    seen: list[int] = []
    real_append = store.append

    def append(events: list[Event]) -> None:  # the setting each append commits with
        with store._tx() as db:
            seen.append(int(db.execute("PRAGMA synchronous").fetchone()[0]))
        real_append(events)
        seen.append(_synchronous(store))

    try:
        assert _synchronous(store) == 2  # FULL
        store.acquire_relay("me")
        append([Event(type="t", stream="s")])
        assert store.route(Router([], ["d"]), 10, time.time()) == 1
        assert _synchronous(store) == 1  # NORMAL: the relay's bookkeeping
        claimed = store.claim("d", limit=10, per_lane=10, owner="me", lease_seconds=30, now=time.time())
        store.settle("d", "me", [Settlement(c.delivery_id, "s", "delivered") for c in claimed], time.time())
        assert _synchronous(store) == 1

        def broken(event: Event) -> list[str]:
            raise RuntimeError("router bug")

        append([Event(type="t", stream="s")])
        with pytest.raises(RuntimeError, match="router bug"):
            store.route(broken, 10, time.time())
        assert not store._db.in_transaction
        append([Event(type="t", stream="s")])
        assert seen == [2] * 6
        store.release_relay("me")
    finally:
        store.close()


def test_migration_3_drops_the_event_seq_index_and_keeps_data(tmp_path: Path) -> None:
    """An outbox created at schema 2 (with the deliveries.event_seq index) opens at the current
    version without that index, its pending deliveries intact and still deliverable; prune still
    keeps what is pending."""
    path = tmp_path / "old.db"
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("CREATE TABLE outrelay_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
    for script in MIGRATIONS[:2]:
        for stmt in script:
            db.execute(stmt)
    db.execute("INSERT OR REPLACE INTO outrelay_meta VALUES ('schema_version', '2')")
    db.close()
    store = SQLiteStore(f"sqlite:///{path}")
    try:
        store.acquire_relay("me")
        old = Event(type="t", stream="s", time=Event(type="t", stream="s").time.replace(year=2020))
        store.append([old, Event(type="t", stream="s")])
        store.route(Router([], ["d"]), 10, time.time())
        version = store._db.execute("SELECT value FROM outrelay_meta WHERE key='schema_version'").fetchone()[0]
        assert int(version) == len(MIGRATIONS) >= 3
        indexes = {r[0] for r in store._db.execute("SELECT name FROM sqlite_master WHERE type='index'")}
        assert "outrelay_deliveries_event" not in indexes
        assert store.prune(time.time()) == 0  # both still pending
        claimed = store.claim("d", limit=10, per_lane=10, owner="me", lease_seconds=30, now=time.time())
        assert [c.event.id for c in claimed] == [e.id for e in store.events()]
        store.settle("d", "me", [Settlement(claimed[0].delivery_id, "s", "delivered")], time.time())
        assert store.prune(time.time()) == 1  # the old, delivered one
        store.release_relay("me")
    finally:
        store.close()


def test_an_empty_claim_does_not_wait_for_a_writer(tmp_path: Path) -> None:
    """With nothing due, a claim answers from a read: an appender holding the write lock (here a
    second connection inside BEGIN IMMEDIATE) does not make it wait (a claim that took the write
    lock would retry until BUSY_TIMEOUT, then raise "database is locked"). With a lane due, the
    claim takes the write lock as before, and finds the delivery once the writer is done."""
    store = SQLiteStore(f"sqlite:///{tmp_path}/o.db")
    writer = sqlite3.connect(f"{tmp_path}/o.db", isolation_level=None, timeout=0.0)
    try:
        store.acquire_relay("me")
        writer.execute("BEGIN IMMEDIATE")
        assert store.claim("d", limit=10, per_lane=10, owner="me", lease_seconds=30, now=time.time()) == []
        writer.execute("COMMIT")

        store.append([Event(type="t", stream="s")])
        assert store.route(Router([], ["d"]), 10, time.time()) == 1
        [got] = store.claim("d", limit=10, per_lane=10, owner="me", lease_seconds=30, now=time.time())
        assert got.event.stream == "s"
        store.release_relay("me")
    finally:
        writer.close()
        store.close()


def test_route_and_claim_is_one_transaction_and_quiet_until_saves_empty_claims(tmp_path: Path) -> None:
    """route_and_claim routes and claims in one call (a failure rolls both back); a claim that is not
    full tells quiet_until when the next lane is due, which routing, a settle keeping a lane pending
    and an operator's write forget or lower."""
    store = SQLiteStore(f"sqlite:///{tmp_path}/o.db")
    claim = {"limit": 10, "per_lane": 10, "owner": "me", "lease_seconds": 30.0}
    try:
        store.acquire_relay("me")
        now = time.time()
        assert store.quiet_until("a", 5.0) == 0.0  # nothing known yet
        store.append([Event(type="t", stream="s"), Event(type="t", stream="s2")])

        def broken(event: Event) -> list[str]:
            raise RuntimeError("router bug")

        with pytest.raises(RuntimeError, match="router bug"):
            store.route_and_claim(broken, 100, "a", **claim, now=now)
        assert store.unrouted() == 2 and not store._db.in_transaction
        routed, claimed = store.route_and_claim(Router([], ["a", "b"]), 100, "a", **claim, now=now)
        assert routed == 2 and [c.event.stream for c in claimed] == ["s", "s2"]
        assert store.status(["b"], now)[0].pending == 2
        # not full, every lane held: nothing due until a settle or a routing says otherwise
        assert store.quiet_until("a", 5.0) == now + 5.0
        store.settle("a", "me", [Settlement(claimed[0].delivery_id, "s", "delivered")], now)
        assert store.quiet_until("a", 5.0) == now + 5.0  # lane s is gone: nothing new due
        store.settle("a", "me", [Settlement(claimed[1].delivery_id, "s2", "retry", attempts=1, due_at=now + 2)], now)
        assert store.quiet_until("a", 5.0) == now + 2  # s2 is due again then
        store.retry_now("a", stream=None, now=now)  # an operator's write: forgotten
        assert store.quiet_until("a", 5.0) == 0.0
        assert [c.event.stream for c in store.claim("a", **claim, now=now)] == ["s2"]
        assert store.quiet_until("a", 5.0) == now + 5.0
        store.append([Event(type="t", stream="s3")])
        assert store.route(Router([], ["a"]), 100, now) == 1
        assert store.quiet_until("a", 5.0) == 0.0  # routed: claim again
        assert [c.event.stream for c in store.claim("a", **claim, now=now)] == ["s3"]
    finally:
        store.close()
