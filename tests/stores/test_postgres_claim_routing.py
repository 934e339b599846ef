"""PostgreSQL: routing inside a destination's claim, relaxed transactions, and NOTIFY echoes.

An append wakes the relay; where the store offers ``route_and_claim`` (PostgreSQL
without the audit chain) the next destination to claim routes the new events in
the same transaction, and the router takes over when no destination claims
within ``_HANDOFF``. A store's own ``routed`` notification is delivered to its
listeners directly, not echoed back through the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest

from outrelay import Event, Outbox, Relay
from outrelay.core.config.config import DestinationConfig, OutrelayConfig, RelayConfig
from outrelay.core.model.errors import StoreError
from outrelay.core.stores.base import Settlement
from outrelay.core.stores.postgres import PostgresStore
from outrelay.transports.memory import MemoryConfig, MemoryTransport
from tests.stores.conftest import pg_admin_url, pg_url

T0 = 1_000_000.0
CLAIM = {"limit": 100, "per_lane": 100, "owner": "r1", "lease_seconds": 30.0, "now": T0}


def ev(stream: str, n: int) -> Event:
    return Event(type="t.x", stream=stream, data={"n": n})


@pytest.fixture
def store(pg_schema: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url(pg_schema))
    yield s
    s.close()


def to_both(e: Event) -> list[str]:
    return ["a", "b"]


class TestRouteAndClaim:
    def test_routes_every_destination_and_claims_one_in_order(self, store: PostgresStore) -> None:
        """New events are routed to every destination and the caller's are claimed, each stream in order."""
        events = [ev(f"s{i % 2}", i) for i in range(6)]
        store.append(events)
        routed, claimed = store.route_and_claim(to_both, 100, "a", **CLAIM)
        assert routed == 6 and store.unrouted() == 0
        for stream in ("s0", "s1"):
            want = [e.id for e in events if e.stream == stream]
            assert [c.event.id for c in claimed if c.event.stream == stream] == want
        assert len(claimed) == 6
        # the other destination's deliveries wait for its own claim; a's lanes are leased
        assert len(store.claim("b", **CLAIM)) == 6
        assert store.claim("a", **{**CLAIM, "owner": "r2"}) == []
        store.settle("a", "r1", [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed], T0)
        assert store.claim("a", **CLAIM) == []

    def test_routing_is_skipped_while_another_relay_routes(self, store: PostgresStore, pg_schema: str) -> None:
        """With the routing lock held elsewhere it only claims; the events stay queued for that router."""
        store.append([ev("s", 0)])
        with psycopg.connect(pg_admin_url()) as other:
            other.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (store.n.route_key,))
            assert store.route_and_claim(to_both, 100, "a", **CLAIM) == (0, [])
            assert store.unrouted() == 1
        routed, claimed = store.route_and_claim(to_both, 100, "a", **CLAIM)
        assert routed == 1 and [c.event.stream for c in claimed] == ["s"]

    def test_a_failed_claim_rolls_the_routing_back(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        """Routing and claiming commit together or not at all: nothing is routed by a claim that failed."""
        store.append([ev("s", 0)])

        def broken(*args: Any, **kwargs: Any) -> Any:
            raise psycopg.errors.UndefinedTable("relation does not exist")

        monkeypatch.setattr(store, "_claim_in", broken)
        with pytest.raises(StoreError):
            store.route_and_claim(to_both, 100, "a", **CLAIM)
        assert store.unrouted() == 1
        monkeypatch.undo()
        assert store.route_and_claim(to_both, 100, "a", **CLAIM)[0] == 1

    def test_not_offered_with_the_audit_chain(self, pg_schema: str) -> None:
        """The audit chain records routing and claiming apart: the combined call refuses, and the relay routes."""
        from outrelay import parse_config

        cfg = parse_config(
            {
                "outbox": {"url": pg_url(pg_schema)},
                "audit": {"enabled": True},
                "destinations": {"a": {"transport": "memory", "broker": "claim-audit"}},
            }
        )
        relay = Relay(config=cfg)
        try:
            with pytest.raises(RuntimeError, match="audit chain"):
                relay.store.route_and_claim(to_both, 100, "a", **CLAIM)  # type: ignore[attr-defined]
        finally:
            relay.outbox.close()


class TestRelaxedTransactions:
    def test_a_failed_statement_rolls_back_and_the_connection_is_reused(self, store: PostgresStore) -> None:
        """A statement that fails inside a relaxed transaction is a StoreError; the pool stays usable."""
        with pytest.raises(StoreError, match="no_such_table"):
            store._run(lambda cur: cur.execute("SELECT * FROM no_such_table"), relaxed=True)
        assert store._run(lambda cur: cur.execute("SELECT 1").fetchone(), relaxed=True) == (1,)

    def test_a_swallowed_error_is_not_reported_as_committed(self, store: PostgresStore) -> None:
        """COMMIT of an aborted transaction rolls back: that is an error, not a silent success."""

        def swallow(cur: Any) -> None:
            cur.execute("CREATE TEMP TABLE kept (x int)")
            with contextlib.suppress(psycopg.Error):  # a caller that swallows the failure
                cur.execute("SELECT * FROM no_such_table")

        with pytest.raises(StoreError, match="rolled back"):
            store._run(swallow, relaxed=True)

    def test_relaxed_runs_without_waiting_for_the_wal(self, store: PostgresStore) -> None:
        """The relay's transactions commit with synchronous_commit off; others keep the server's setting."""
        assert store._run(lambda cur: cur.execute("SHOW synchronous_commit").fetchone(), relaxed=True) == ("off",)
        assert store._run(lambda cur: cur.execute("SHOW synchronous_commit").fetchone()) == ("on",)


class TestRoutedNotifications:
    def test_own_routing_wakes_listeners_once_and_others_through_the_server(self, pg_schema: str) -> None:
        """A store's listeners hear its own routing once (directly, not echoed by the server) and
        another store's routing through NOTIFY."""
        mine, theirs = PostgresStore(pg_url(pg_schema)), PostgresStore(pg_url(pg_schema))
        heard: list[str] = []
        got = threading.Event()
        stop = mine.listen(lambda what: (heard.append(what), got.set()))
        try:
            deadline = time.monotonic() + 10
            while not got.is_set() and time.monotonic() < deadline:  # LISTEN is in place once an append is heard
                theirs.append([ev("s", 0)])
                got.wait(0.2)
            assert got.is_set()
            time.sleep(0.3)
            heard.clear()
            mine.append([ev("s", 1)])  # appended (echo of a foreign-looking append: passed on)
            time.sleep(0.3)
            heard.clear()
            assert mine.route(to_both, 100, T0) >= 1
            time.sleep(0.5)  # the server's echo would have arrived by now
            assert heard == ["routed"]
            theirs.append([ev("s", 2)])
            time.sleep(0.3)
            heard.clear()
            assert theirs.route(to_both, 100, T0) == 1
            deadline = time.monotonic() + 5
            while "routed" not in heard and time.monotonic() < deadline:
                time.sleep(0.02)
            assert heard == ["routed"]
        finally:
            stop()
            mine.close()
            theirs.close()


@contextlib.asynccontextmanager
async def running(relay: Relay, pg_schema: str) -> AsyncIterator[Outbox]:
    """Run ``relay`` (idle and LISTENing after a second); yield another Outbox on the same schema,
    whose appends reach the relay through NOTIFY only. Stops the relay and closes both outboxes."""
    task = asyncio.create_task(relay.run())
    other = Outbox.open(pg_url(pg_schema))
    try:
        await asyncio.sleep(1.0)
        yield other
    finally:
        other.close()
        relay.stop()
        await task
        relay.outbox.close()


class TestRelayRoutesInClaims:
    async def test_appends_elsewhere_are_routed_by_claims_in_order(self, pg_schema: str) -> None:
        """Appends committed by another process reach two destinations well before the poll, in order per
        stream, routed by the destinations' claims (the router stays idle)."""
        outbox = Outbox.open(pg_url(pg_schema))
        brokers = {d: MemoryTransport.broker(f"claim-routing-{d}") for d in ("a", "b")}
        for b in brokers.values():
            b.clear()
        relay = Relay(
            outbox,
            OutrelayConfig(relay=RelayConfig(poll_interval=30)),
            transports={d: MemoryTransport(MemoryConfig(broker=f"claim-routing-{d}")) for d in brokers},
        )
        combined = 0
        original = outbox.store.route_and_claim  # type: ignore[attr-defined]

        def counting(*args: Any, **kwargs: Any) -> Any:
            nonlocal combined
            result = original(*args, **kwargs)
            combined += result[0]
            return result

        outbox.store.route_and_claim = counting  # type: ignore[attr-defined]
        async with running(relay, pg_schema) as other:
            events = [ev(f"s{i % 3}", i) for i in range(60)]
            started = time.monotonic()
            for e in events:
                await asyncio.to_thread(other.append, e)
            while any(len(b.all()) < 60 for b in brokers.values()) and time.monotonic() - started < 20:
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - started
        for b in brokers.values():
            got = [m.event.id for m in b.all()]
            for stream in ("s0", "s1", "s2"):
                want = [e.id for e in events if e.stream == stream]
                assert [i for i in got if i in set(want)] == want
            assert len(got) == 60
        assert elapsed < 10  # far below the 30 s poll: every append woke the relay
        assert combined >= 30  # most events were routed by claims (the router may take a few)

    async def test_the_router_routes_when_no_destination_claims(self, pg_schema: str) -> None:
        """With its only destination paused, nothing claims: the router still routes new appends
        within the hand-off, not at the next poll."""
        outbox = Outbox.open(pg_url(pg_schema))
        relay = Relay(
            outbox,
            OutrelayConfig(
                relay=RelayConfig(poll_interval=30),
                destinations={"a": DestinationConfig(transport="memory", enabled=False)},
            ),
            transports={"a": MemoryTransport(MemoryConfig(broker="claim-routing-paused"))},
        )
        async with running(relay, pg_schema) as other:
            await asyncio.to_thread(other.append, ev("s", 0))
            started = time.monotonic()
            while outbox.store.unrouted() and time.monotonic() - started < 10:
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - started
        assert elapsed < 3.0
        assert MemoryTransport.broker("claim-routing-paused").all() == []
