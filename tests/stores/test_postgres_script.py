"""PostgreSQL: the relay's one-message transactions (route+claim, claim, settle) and what a store
knows is not due (``quiet_until``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outrelay import Event
from outrelay.core.model.errors import StoreError
from outrelay.core.stores.base import InlineRefused, Settlement
from outrelay.core.stores.postgres import PostgresStore
from outrelay.core.stores.postgres_script import _literal
from tests.stores.conftest import pg_admin_url, pg_url

CLAIM = {"limit": 100, "per_lane": 100, "owner": "r1", "lease_seconds": 30.0}


class Both:
    """A router with static destinations, as the relay's Router is without content-based routes."""

    static_destinations = ("a", "b")

    def __call__(self, event: Event) -> list[str]:
        return ["a", "b"]


def ev(stream: str, n: int, data: bytes | None = None) -> Event:
    return Event(type="t.x", stream=stream, data=data if data is not None else {"n": n})


@pytest.fixture
def store(pg_schema: str) -> Iterator[PostgresStore]:
    s = PostgresStore(pg_url(pg_schema))
    yield s
    s.close()


def delivered(claimed: list[Any]) -> list[Settlement]:
    return [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed]


class TestOneMessageTransactions:
    def test_static_routing_claims_in_order_and_leaves_the_rest_queued(self, store: PostgresStore) -> None:
        """Static routes route every destination in the claim's message; each stream's events come in order."""
        events = [ev(f"s{i % 2}", i) for i in range(6)]
        store.append(events)
        now = time.time()
        routed, claimed = store.route_and_claim(Both(), 100, "a", **CLAIM, now=now)
        assert routed == 6 and store.unrouted() == 0
        for stream in ("s0", "s1"):
            want = [e.id for e in events if e.stream == stream]
            assert [c.event.id for c in claimed if c.event.stream == stream] == want
        assert len(claimed) == 6
        assert store.claim("a", **CLAIM, now=now) == []  # leased by r1
        assert len(store.claim("b", **CLAIM, now=now)) == 6
        store.settle("a", "r1", delivered(claimed), now)
        assert store.next_due("a") is None

    def test_a_failed_claim_rolls_the_routing_back(self, store: PostgresStore, monkeypatch: pytest.MonkeyPatch) -> None:
        """Routing and claiming commit together or not at all, in the one-message path too."""
        store.append([ev("s", 0)])
        original = store._claim_args

        def broken(destination: str, **claim: Any) -> dict[str, Any]:
            return {**original(destination, **claim), "budget": "not a number"}

        monkeypatch.setattr(store, "_claim_args", broken)
        with pytest.raises(StoreError):
            store.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time())
        assert store.unrouted() == 1
        monkeypatch.undo()
        assert store.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time())[0] == 1

    def test_payloads_and_attributes_come_back_exactly(self, store: PostgresStore) -> None:
        """The text-format claim returns every byte value and non-ASCII attributes as stored."""
        data = bytes(range(256)) * 3
        event = Event(
            type="t.x", stream="s", data=data, content_type="application/octet-stream", metadata={"k": "é✓\\'\""}
        )
        store.append([event])
        routed, claimed = store.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time())
        assert routed == 1 and claimed[0].event.data == data
        assert claimed[0].event.metadata == event.metadata and claimed[0].event.id == event.id

    def test_a_statement_deallocated_behind_the_store_is_prepared_again(self, store: PostgresStore) -> None:
        """A connection that lost a prepared statement gets it again, without an error."""
        store.append([ev("s", 0)])
        assert store.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time())[0] == 1
        with store._pool.connection() as conn:  # the connection the store used last (LIFO)
            conn.execute("DEALLOCATE outrelay_claim")
        assert len(store.claim("b", **CLAIM, now=time.time())) == 1


class TestQuietUntil:
    def test_an_empty_claim_says_nothing_is_due_until_the_next_lane(self, store: PostgresStore) -> None:
        """After a claim found nothing, the store knows it until a poll interval has passed."""
        now = time.time()
        assert store.claim("a", **CLAIM, now=now) == []
        assert store.quiet_until("a", 5.0) == pytest.approx(now + 5.0)
        assert store.quiet_until("b", 5.0) == 0.0  # never claimed: unknown

    def test_routing_and_other_transactions_forget_it(self, store: PostgresStore) -> None:
        """Routing by this store, and any transaction off the relay's path, make the store ask again."""
        store.claim("a", **CLAIM, now=time.time())
        store.append([ev("s", 0)])
        assert store.route(Both(), 100, time.time()) == 1
        assert store.quiet_until("a", 5.0) == 0.0
        store.claim("a", **CLAIM, now=time.time())
        store.claim("b", **CLAIM, now=time.time())
        assert store.quiet_until("b", 5.0) > time.time()
        store.status(["a"], time.time())
        assert store.quiet_until("b", 5.0) == 0.0

    def test_a_settle_that_keeps_a_lane_pending_makes_it_due(self, store: PostgresStore) -> None:
        """A lane still holding deliveries after a settle is due again: the hint drops to its due time."""
        store.append([ev("s", i) for i in range(3)])
        now = time.time()
        _, claimed = store.route_and_claim(Both(), 100, "a", **{**CLAIM, "per_lane": 2}, now=now)
        assert len(claimed) == 2 and store.quiet_until("a", 60.0) > now + 30
        store.settle("a", "r1", delivered(claimed), now)
        assert store.quiet_until("a", 60.0) <= now
        assert len(store.claim("a", **CLAIM, now=now)) == 1

    def test_another_relays_routing_is_heard(self, pg_schema: str, store: PostgresStore) -> None:
        """A 'routed' notice from another process forgets the hint before the callback runs."""
        other = PostgresStore(pg_url(pg_schema))
        heard = threading.Event()
        routed = threading.Event()
        seen: list[float] = []

        def callback(what: str) -> None:
            seen.append(store.quiet_until("a", 60.0))
            heard.set()
            if what == "routed":
                routed.set()

        stop = store.listen(callback)
        try:
            deadline = time.monotonic() + 10
            while not heard.is_set() and time.monotonic() < deadline:  # LISTEN is in place once heard
                other.append([ev("w", 0)])
                heard.wait(0.2)
            other.route(Both(), 100, time.time())
            assert routed.wait(5)
            store.claim("a", **CLAIM, now=time.time())  # takes what was routed: the next claim finds nothing
            store.claim("a", **CLAIM, now=time.time())
            assert store.quiet_until("a", 60.0) > time.time()
            seen.clear()
            other.append([ev("w", 1)])
            other.route(Both(), 100, time.time())
            deadline = time.monotonic() + 5
            while 0.0 not in seen and time.monotonic() < deadline:
                time.sleep(0.02)
            assert 0.0 in seen
        finally:
            stop()
            other.close()


def test_relay_statements_use_prepared_plans(store: PostgresStore, pg_schema: str) -> None:
    """The one-message transactions EXECUTE statements prepared on the connection (the server plans once)."""
    store.append([ev("s", 0)])
    store.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time())
    with store._pool.connection() as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM pg_prepared_statements").fetchall()}
    assert {"outrelay_route", "outrelay_lock", "outrelay_claim", "outrelay_due"} <= names


class TestLiterals:
    @pytest.mark.parametrize("conforming", ["on", "off"])
    def test_values_reach_the_server_exactly(self, store: PostgresStore, conforming: str) -> None:
        """Quotes, backslashes and non-ASCII in stream names, and full-precision floats, arrive as given,
        whatever standard_conforming_strings says."""
        values = ["a'b\\c\"d\\'", ["x\\", "y'z", "", "é✓"], [1733333333.1234567, 1e-05], [1, 2**40], [True, False]]
        with store._pool.connection() as conn:
            conn.execute(f"SET standard_conforming_strings = {conforming}")
            try:
                row = conn.execute(f"SELECT {', '.join(str(_literal(v)) for v in values)}").fetchone()
                sent = conn.execute(
                    "SELECT %s::text, %s::text[], %s::float8[], %s::bigint[], %s::bool[]", values
                ).fetchone()
            finally:
                conn.execute("RESET standard_conforming_strings")
        assert row is not None and sent is not None
        assert [row[0], row[1], [float(x) for x in row[2]], row[3], row[4]] == values == list(sent)

    def test_a_nul_is_refused_not_cut(self) -> None:
        """A string holding NUL is not quoted here (the query text would end at it): psycopg refuses it."""
        assert _literal("a\x00b") is None and _literal(["a\x00"]) is None


class TestInlineCalls:
    """``PostgresStore.call_inline``: the relay's hot-path calls in the caller's thread, on an idle pooled
    connection; refused (nothing done) where it would wait, or where a failure would be retried."""

    def test_runs_in_the_callers_thread_on_a_pooled_connection(self, store: PostgresStore) -> None:
        store.append([ev("s", 0)])
        store.next_due("a")  # a connection is open and idle in the pool now
        seen: list[int] = []
        real = store.route_and_claim

        def call() -> tuple[int, list[Any]]:
            seen.append(threading.get_ident())
            return real(Both(), 100, "a", **CLAIM, now=time.time())

        routed, claimed = store.call_inline(call)
        assert seen == [threading.get_ident()]
        assert routed == 1 and [c.event.stream for c in claimed] == ["s"]
        store.call_inline(lambda: store.settle("a", "r1", delivered(claimed), time.time()))
        assert store.claim("a", **CLAIM, now=time.time() + 60) == []  # settled: nothing left to claim

    def test_refused_when_every_connection_is_in_use(self, pg_schema: str) -> None:
        s = PostgresStore(pg_url(pg_schema, pool_size="1"))
        try:
            s.append([ev("s", 0)])
            taken, release = threading.Event(), threading.Event()

            def hold() -> None:
                with s._pool.connection():
                    taken.set()
                    release.wait(5)

            t = threading.Thread(target=hold)
            t.start()
            assert taken.wait(5)
            try:
                with pytest.raises(InlineRefused, match="in use"):
                    s.call_inline(lambda: s.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time()))
            finally:
                release.set()
                t.join(5)
            assert s.unrouted() == 1  # the refused call did nothing
            routed, claimed = s.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time())
            assert routed == 1 and len(claimed) == 1
        finally:
            s.close()

    def test_refused_rather_than_connecting(self, pg_schema: str) -> None:
        s = PostgresStore(pg_url(pg_schema, pool_size="2"))  # one connection open (the migration's)
        taken, release = threading.Event(), threading.Event()

        def hold() -> None:  # the open one, elsewhere: a free slot, no idle connection
            with s._pool.connection():
                taken.set()
                release.wait(5)

        t = threading.Thread(target=hold)
        t.start()
        try:
            assert taken.wait(5)
            with pytest.raises(InlineRefused, match="connecting would wait"):
                s.call_inline(lambda: s.next_due("a"))
            assert s.next_due("a") is None  # outside call_inline, the store connects
        finally:
            release.set()
            t.join(5)
            s.close()

    def test_a_dropped_connection_is_refused_not_retried_inline(self, store: PostgresStore) -> None:
        """A failure the store would retry (after a sleep, or a reconnect) goes back to its thread."""
        store.append([ev("s", 0)])
        store.next_due("a")
        with psycopg.connect(pg_admin_url(), autocommit=True) as admin:
            for pid in list(store._pool.pids):
                admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        with pytest.raises(InlineRefused):
            store.call_inline(lambda: store.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time()))
        routed, claimed = store.route_and_claim(Both(), 100, "a", **CLAIM, now=time.time())
        assert routed == 1 and len(claimed) == 1
