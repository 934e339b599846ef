"""History reads, upcasting on read, replay and retention on SQLite and PostgreSQL alike."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from outrelay import Event
from outrelay.core.history.history import aread_stream, ascan, read_stream, scan
from outrelay.core.history.lean import read_lean
from outrelay.core.history.replay import Projection, rebuild, replay, replay_many, verify_snapshot
from outrelay.core.history.upcasting import Upcasters
from outrelay.core.model.errors import EventError, NotFoundError
from outrelay.core.stores.base import Settlement, Store

T0 = datetime(2026, 1, 1, tzinfo=UTC)
NONE = Upcasters()  # read events as stored


def ev(stream: str, n: int, type: str = "order.created", minutes: int = 0, **kw: Any) -> Event:
    return Event(type=type, stream=stream, data={"n": n}, time=T0 + timedelta(minutes=minutes), **kw)


def deliver_all(store: Store, dest: str = "d") -> None:
    """Route every event to ``dest`` and settle every delivery as delivered."""
    store.route(lambda e: [dest], 100_000, 0.0)
    while got := store.claim(dest, limit=500, per_lane=500, owner="t", lease_seconds=30, now=0.0):
        store.settle(dest, "t", [Settlement(c.delivery_id, c.event.stream, "delivered") for c in got], 0.0)


class TestRead:
    def test_one_stream_in_order_from_a_sequence_or_a_time(self, store: Store) -> None:
        """read_stream returns only that stream, in order, after a sequence or from a time."""
        stored = store.append([ev(f"s{i % 3}", i, minutes=i) for i in range(30)])
        s1 = [e for e in stored if e.stream == "s1"]
        got = list(read_stream(store, "s1", page=3, upcasters=NONE))
        assert [e.id for e in got] == [e.id for e in s1]
        assert [e.id for e in read_stream(store, "s1", after=s1[4].sequence or 0, upcasters=NONE)] == [
            e.id for e in s1[5:]
        ]
        since = T0 + timedelta(minutes=22)  # s1's 8th event (n=22) was written at minute 22
        assert [e.id for e in read_stream(store, "s1", since=since, upcasters=NONE)] == [e.id for e in s1[7:]]

    def test_filtered_scan_by_type_glob_tenant_and_time_range(self, store: Store) -> None:
        """scan keeps events matching every filter: type globs, tenant, since <= time < until."""
        store.append(
            [
                ev("a", 0, "order.created", 0, tenant="t1"),
                ev("b", 1, "order.paid", 1, tenant="t1"),
                ev("c", 2, "user.created", 2, tenant="t1"),
                ev("d", 3, "order_x", 3, tenant="t2"),
                ev("e", 4, "order.created", 10, tenant="t1"),
            ]
        )

        def ns(**kw: Any) -> list[int]:
            return [e.json()["n"] for e in scan(store, upcasters=NONE, page=2, **kw)]

        assert ns(types=["order.*"]) == [0, 1, 4]
        assert ns(types=["*.created"], tenant="t1") == [0, 2, 4]
        assert ns(types=["order?x"]) == [3]  # ? is one character; "_" in a name is literal
        assert ns(since=T0 + timedelta(minutes=1), until=T0 + timedelta(minutes=3)) == [1, 2]
        assert ns(since=T0 + timedelta(days=1)) == []  # empty range: nothing, no error
        assert ns(limit=2) == [0, 1]

    def test_async_iterators_give_the_same_events(self, store: Store) -> None:
        """aread_stream and ascan yield what their sync counterparts yield."""
        store.append([ev(f"s{i % 2}", i, minutes=i) for i in range(9)])

        async def collect() -> tuple[list[str], list[str]]:
            one = [e.id async for e in aread_stream(store, "s0", page=2, upcasters=NONE)]
            alls = [e.id async for e in ascan(store, types=["order.*"], page=4, upcasters=NONE)]
            return one, alls

        one, alls = asyncio.run(collect())
        assert one == [e.id for e in read_stream(store, "s0", upcasters=NONE)]
        assert alls == [e.id for e in scan(store, upcasters=NONE)]

    def test_reading_while_the_relay_delivers_loses_and_reorders_nothing(self, store: Store) -> None:
        """A reader following a stream while events are appended and delivered sees them all, in order."""
        stop = threading.Event()

        def writer() -> None:
            for i in range(200):
                store.append([ev("live", i)])
                if i % 20 == 0:
                    deliver_all(store)
            stop.set()

        t = threading.Thread(target=writer)
        t.start()
        seen: list[int] = []
        after = 0
        deadline = time.monotonic() + 30
        while len(seen) < 200 and time.monotonic() < deadline:
            for e in read_stream(store, "live", after=after, page=7, upcasters=NONE):
                seen.append(e.json()["n"])
                after = e.sequence or after
        t.join(10)
        assert seen == list(range(200))


class TestUpcasting:
    @staticmethod
    def chain() -> Upcasters:
        up = Upcasters()
        up.register("wf.started", 1, lambda d: {**d, "v": 2})

        @up.upcaster("wf.started", "2")
        def two_to_three(d: Any) -> Any:
            return {"name": d["n"], "v": 3}

        return up

    def test_v1_events_read_as_v3_everywhere(self, store: Store) -> None:
        """A v1 -> v2 -> v3 chain makes v1 and v2 events read as v3 on read_stream, scan and replay."""
        store.append(
            [
                ev("w", 1, "wf.started"),
                ev("w", 2, "wf.started", event_version="2"),
                Event(type="wf.started", stream="w", data={"name": 3, "v": 3}, event_version="3"),
                ev("w", 4, "other"),
            ]
        )
        up = self.chain()
        want = [{"name": 1, "v": 3}, {"name": 2, "v": 3}, {"name": 3, "v": 3}]
        got = [e for e in read_stream(store, "w", upcasters=up) if e.type == "wf.started"]
        assert [e.json() for e in got] == want and {e.event_version for e in got} == {"3"}
        assert [e.json() for e in scan(store, types=["wf.*"], upcasters=up)] == want
        folded = replay(store, "w", lambda s, e: [*s, e.json()], [], upcasters=up)
        assert folded.state[:3] == want and folded.state[3] == {"n": 4}

    def test_a_missing_step_names_type_and_versions(self, store: Store) -> None:
        """An event whose version has no upcaster towards the current one is an EventError naming both."""
        store.append([ev("w", 1, "wf.started", event_version="0")])
        with pytest.raises(EventError, match=r"'wf.started' is at version 0 .* towards 3"):
            list(read_stream(store, "w", upcasters=self.chain()))


class Counter(Projection[dict[str, Any]]):
    name = "counter"

    def initial(self) -> dict[str, Any]:
        return {"count": 0, "sum": 0, "last": None}

    def apply(self, state: dict[str, Any], event: Event) -> dict[str, Any]:
        n = event.json()["n"]
        return {"count": state["count"] + 1, "sum": state["sum"] + n, "last": n}


class LeanCounter(Counter):
    lean = True


class TestLean:
    def test_lean_fold_gives_the_same_state_with_upcasting(self, store: Store) -> None:
        """A lean projection folds to the same state as a full one, upcast through the same chain."""
        up = Upcasters()
        up.register("order.created", "1", lambda d: {"n": d["n"] * 10})
        store.append([ev("s", i, event_version="2" if i % 2 else "1") for i in range(50)])
        store.append([Event(type="odd", stream="s", data={"n": 1}, event_version='a"b')])  # the slow path
        full = rebuild(store, Counter(), "s", use_snapshot=False, upcasters=up)
        lean = rebuild(store, LeanCounter(), "s", use_snapshot=False, upcasters=up)
        assert lean == full and full.state["sum"] == sum(i * 10 if i % 2 == 0 else i for i in range(50)) + 1
        seen: list[str] = []
        replay(store, "s", lambda s, e: seen.append(e.event_version), None, lean=True, upcasters=up)
        assert seen == ["2"] * 50 + ['a"b']

    def test_lean_events_carry_the_whole_envelope_on_demand(self, store: Store) -> None:
        """A LeanEvent answers every Event attribute (decoded on first access) and to_event() gives
        the same upcast Event a full read gives; folds that ask nothing of the envelope read only rows."""
        up = Upcasters()
        up.register("order.created", "1", lambda d: {"n": d["n"] * 10})
        store.append(
            [
                ev("s", i, minutes=i, event_version="2" if i % 3 else "1", tenant="acme", labels={"k": f"v{i}"})
                for i in range(7)
            ]
            + [ev("s", 7, type="other", correlation_id="c-7", tags=("a", "b"), metadata={"m": "1"})]
        )
        full = list(read_stream(store, "s", upcasters=up))
        lean: list[Any] = replay(store, "s", lambda acc, e: [*acc, e], [], lean=True, upcasters=up).state
        assert [e.sequence for e in lean] == [e.sequence for e in full]
        for le, fe in zip(lean[::-1], full[::-1], strict=True):  # the last page's envelopes first
            assert (le.type, le.event_version, le.data, le.json()) == (fe.type, fe.event_version, fe.data, fe.json())
            for name in ("id", "time", "tenant", "labels", "tags", "metadata", "correlation_id", "source", "time_text"):
                assert getattr(le, name) == getattr(fe, name), name
            got = le.to_event()
            assert isinstance(got, Event) and got.attributes() == fe.attributes()
            assert (got.data, got.sequence) == (fe.data, fe.sequence) and le.to_event() is got
        assert full[0].event_version == "2" and full[0].json() == {"n": 0}  # the v1 event came upcast
        paged = list(read_lean(store, "s", page=3, upcasters=up))  # envelopes found page by page
        assert [e.id for e in reversed(paged)] == [e.id for e in reversed(full)]
        with pytest.raises(AttributeError):
            _ = lean[0].not_an_event_field

    def test_lean_fold_reports_a_missing_step(self, store: Store) -> None:
        """The lean path raises the same EventError for a version with no upcaster path."""
        up = Upcasters()
        up.register("order.created", "2", lambda d: d)
        store.append([ev("s", 1)])
        with pytest.raises(EventError, match=r"'order.created' is at version 1 and no upcaster goes from 1 towards 3"):
            replay(store, "s", lambda s, e: s, None, lean=True, upcasters=up)


class TestReplay:
    def test_replay_is_deterministic_and_snapshots_agree(self, store: Store) -> None:
        """Two full replays agree, and a replay from a snapshot gives the same state as one from the start."""
        store.append([ev(f"s{i % 2}", i) for i in range(501)])
        p = Counter()
        first = rebuild(store, p, "s0", use_snapshot=False)
        assert first == rebuild(store, p, "s0", use_snapshot=False)
        assert first.state == {"count": 251, "sum": sum(range(0, 501, 2)), "last": 500}
        with_snaps = rebuild(store, p, "s0", use_snapshot=False, snapshot_every=100)
        snap = store.load_snapshot("counter", "s0")
        assert snap is not None and snap.events == 251 and snap.sequence == first.sequence
        store.append([ev("s0", 1000)])
        warm = rebuild(store, p, "s0")
        assert warm.from_snapshot == first.sequence and warm.events == 1  # only the new event folded
        assert warm.state == rebuild(store, p, "s0", use_snapshot=False).state
        assert with_snaps.state == first.state
        assert verify_snapshot(store, p, "s0")

    def test_a_snapshot_of_another_version_is_ignored(self, store: Store) -> None:
        """Bumping a projection's version makes rebuild fold from the start again."""
        store.append([ev("s", i) for i in range(10)])
        rebuild(store, Counter(), "s", snapshot_every=3)
        p2 = Counter()
        p2.version = "2"
        result = rebuild(store, p2, "s")
        assert result.from_snapshot is None and result.events == 10

    def test_parallel_replay_of_many_streams(self, store: Store) -> None:
        """replay_many gives each stream the state a single replay gives."""
        store.append([ev(f"s{i % 5}", i) for i in range(100)])
        results = replay_many(store, Counter(), [f"s{i}" for i in range(5)], workers=3, use_snapshot=False)
        for name, result in results.items():
            assert result.state == rebuild(store, Counter(), name, use_snapshot=False).state
            assert result.state["count"] == 20

    def test_unknown_stream_is_not_found(self, store: Store) -> None:
        """Replaying a stream with no events raises NotFoundError naming it."""
        with pytest.raises(NotFoundError, match="'nope'"):
            replay(store, "nope", lambda s, e: s, 0)
        assert replay(store, "nope", lambda s, e: s, 0, missing_ok=True).events == 0


class TestRetention:
    def test_prunes_by_age_and_by_count_never_undelivered(self, store: Store) -> None:
        """prune keeps the last N per stream and young events, and never an undelivered one."""
        now = time.time()
        old = datetime.fromtimestamp(now - 7200, UTC)
        store.append([Event(type="t", stream=f"s{i % 2}", data={"n": i}, time=old) for i in range(20)])
        deliver_all(store)
        store.append([Event(type="t", stream="s0", data={"n": 99}, time=old)])  # undelivered
        assert store.prune(None) == 0  # no policy: nothing goes
        assert store.prune(now - 3 * 3600) == 0  # all younger than that
        assert store.prune(None, keep_last=4, batch=3, max_batches=1) == 3  # one small batch
        assert store.prune(None, keep_last=4, batch=3) > 0
        left = [e.json()["n"] for e in store.events(limit=100)]
        assert left == [13, 14, 15, 16, 17, 18, 19, 99]  # s0 keeps 4 (its undelivered one counts), s1 keeps 4
        assert store.prune(now - 60) == 7  # all old and delivered; 99 waits for delivery
        assert [e.json()["n"] for e in store.events()] == [99]


class TestScale:
    def test_reading_a_long_stream_keeps_memory_flat(self, store: Store) -> None:
        """Iterating 40,000 events holds about one page in memory, not the stream (tracemalloc peak < 4 MB)."""
        import tracemalloc

        for start in range(0, 40_000, 10_000):
            store.append(
                [Event(type="t", stream="big", data={"n": i, "pad": "x" * 100}) for i in range(start, start + 10_000)]
            )
        expect = 0
        tracemalloc.start()
        try:
            for e in read_stream(store, "big", page=500, upcasters=NONE):
                assert e.json()["n"] == expect
                expect += 1
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert expect == 40_000 and peak < 4 * 1024 * 1024, peak

    def test_stream_reads_use_the_stream_sequence_index(self, store: Store) -> None:
        """A stream's history page is an index range scan on (stream, seq), whatever the other rows."""
        from outrelay.core.stores.postgres import PostgresStore
        from outrelay.core.stores.sqlite import SQLiteStore

        if isinstance(store, SQLiteStore):
            plan = store._q(
                "EXPLAIN QUERY PLAN SELECT seq, attrs, data FROM outrelay_events "
                "WHERE seq > ? AND stream = ? ORDER BY seq LIMIT ?",
                (0, "s", 10),
            )
            assert "outrelay_events_stream" in str(plan), plan
        else:
            assert isinstance(store, PostgresStore)
            rows = store._q(
                "SELECT indexdef FROM pg_indexes WHERE schemaname = %s AND indexname = %s",
                (store.n.schema_name, "outrelay_events_stream"),
            )
            assert rows and "(stream, seq)" in rows[0][0], rows


class TestRedeliver:
    def test_requeue_sends_the_selection_again_in_order(self, store: Store) -> None:
        """plan counts the selection without queuing; requeue queues only routed, selected events, in order."""
        from outrelay.core.history.history import HistoryFilter
        from outrelay.core.history.redeliver import plan, requeue

        store.append([ev(f"s{i % 2}", i, "a.x" if i % 3 else "b.y") for i in range(12)])
        deliver_all(store)
        store.append([ev("s0", 99, "a.x")])  # not routed yet: never queued by a replay
        where = HistoryFilter(types=("a.*",))
        p = plan(store, where, upcasters=NONE)
        assert p.count == 9 and p.by_type == {"a.x": 9}
        assert store.claim("d", limit=100, per_lane=100, owner="t", lease_seconds=30, now=0.0) == []
        progress: list[int] = []
        assert requeue(store, "d", where, page=3, progress=progress.append) == 8
        assert progress[-1] == 8
        got = store.claim("d", limit=100, per_lane=100, owner="t", lease_seconds=30, now=time.time() + 1)
        by_stream: dict[str, list[int]] = {}
        for c in got:
            by_stream.setdefault(c.event.stream, []).append(c.event.json()["n"])
        assert by_stream == {"s0": [2, 4, 8, 10], "s1": [1, 5, 7, 11]}
        with pytest.raises(NotFoundError, match="no events in the outbox match stream 'zz'"):
            plan(store, HistoryFilter(stream="zz"), upcasters=NONE)
