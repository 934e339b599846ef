"""One suite of store semantics, run against SQLite and PostgreSQL alike."""

from __future__ import annotations

import time

import pytest

from outrelay import Event
from outrelay.core.model.errors import EventError, NotFoundError
from outrelay.core.stores.base import Claimed, Settlement, Store

T0 = 1_000_000.0
LEASE = 30.0


def ev(stream: str = "s1", n: int = 0, **kw: object) -> Event:
    return Event(type="order.created", stream=stream, data={"n": n}, **kw)  # type: ignore[arg-type]


def to(*dests: str):
    return lambda event: list(dests)


def fill(store: Store, streams: dict[str, int], dests: tuple[str, ...] = ("d",)) -> None:
    """Append ``count`` events per stream (interleaved) and route them."""
    events = [ev(s, i) for i in range(max(streams.values())) for s, c in streams.items() if i < c]
    store.append(events)
    store.route(to(*dests), 10_000, T0)


def claim(
    store: Store, dest: str = "d", *, limit: int = 100, per_lane: int = 10, owner: str = "r1", now: float = T0
) -> list[Claimed]:
    return store.claim(dest, limit=limit, per_lane=per_lane, owner=owner, lease_seconds=LEASE, now=now)


def deliver(store: Store, claimed: list[Claimed], dest: str = "d", owner: str = "r1", now: float = T0) -> None:
    store.settle(dest, owner, [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed], now)


def status(store: Store, dest: str = "d"):
    return store.status([dest], T0)[0]


class TestAppend:
    def test_append_assigns_increasing_sequences(self, store: Store) -> None:
        """Appended events get increasing sequence numbers and read back intact."""
        e1 = ev("s1", 1, tenant="acme", labels={"k": "v"}, metadata={"m": "x"}, tags=("t",))
        stored = store.append([e1, ev("s2", 2)])
        assert [e.sequence for e in stored] == sorted(e.sequence for e in stored)
        back = store.events()
        assert [e.id for e in back] == [e.id for e in stored]
        assert back[0].attributes() == e1.attributes()
        assert back[0].data == e1.data and back[0].sequence == stored[0].sequence

    def test_duplicate_id_is_an_event_error(self, store: Store) -> None:
        """Appending an id already in the outbox raises EventError and appends nothing."""
        e = ev()
        store.append([e])
        with pytest.raises(EventError):
            store.append([ev("s9"), e.replace()])
        assert len(store.events()) == 1

    def test_events_filters_by_stream_and_after(self, store: Store) -> None:
        """events() reads history in sequence order, by stream and after a sequence."""
        stored = store.append([ev("a", 0), ev("b", 1), ev("a", 2)])
        assert [e.id for e in store.events(stream="a")] == [stored[0].id, stored[2].id]
        assert [e.id for e in store.events(after=stored[0].sequence or 0, limit=1)] == [stored[1].id]


class TestRoute:
    def test_route_fans_out_once(self, store: Store) -> None:
        """Routing creates one delivery per destination and marks events routed once."""
        store.append([ev("s", i) for i in range(3)])
        assert store.unrouted() == 3
        assert store.route(to("a", "b"), 100, T0) == 3
        assert store.unrouted() == 0
        assert store.route(to("a", "b"), 100, T0) == 0
        assert status(store, "a").pending == 3 and status(store, "b").pending == 3

    def test_route_respects_limit_and_order(self, store: Store) -> None:
        """Routing takes at most ``limit`` events, oldest first."""
        stored = store.append([ev("s", i) for i in range(5)])
        seen: list[str] = []
        store.route(lambda e: seen.append(e.id) or ["d"], 2, T0)
        assert seen == [e.id for e in stored[:2]]
        assert store.unrouted() == 3

    def test_event_routed_nowhere_is_not_pending(self, store: Store) -> None:
        """An event no route matches is marked routed and leaves no work."""
        store.append([ev()])
        assert store.route(to(), 100, T0) == 1
        assert store.next_due("d") is None and status(store).pending == 0

    def test_static_router_needs_no_decoding(self, store: Store) -> None:
        """A router with static_destinations sends every event there."""

        class Static:
            static_destinations = ("d",)

            def __call__(self, event: Event) -> list[str]:
                raise AssertionError("must not decode")

        store.append([ev("s", i) for i in range(2)])
        assert store.route(Static(), 100, T0) == 2
        assert status(store).pending == 2

    def test_content_routing_reads_no_payload(self, store: Store) -> None:
        """A content-based router is given each event's whole envelope (every field routes
        match on) with empty data: routing reads no payload; the claim then returns it."""
        big = b"x" * 100_000
        e1 = Event(
            type="order.created",
            stream="s",
            source="shop",
            tenant="acme",
            labels={"region": "eu"},
            tags=("vip",),
            data=big,
        )
        stored = store.append([e1, ev("s", 1)])
        seen: list[Event] = []
        store.route(lambda e: seen.append(e) or ["d"], 100, T0)
        assert [e.sequence for e in seen] == [e.sequence for e in stored]
        assert all(e.data == b"" for e in seen)
        assert seen[0].attributes() == stored[0].attributes()
        assert [c.event.data for c in claim(store)] == [big, stored[1].data]


class TestClaim:
    def test_claim_returns_stream_events_in_order(self, store: Store) -> None:
        """A claim returns each lane's deliveries in append order, ``per_lane`` at most."""
        fill(store, {"a": 5, "b": 2})
        got = claim(store, per_lane=3)
        by_stream: dict[str, list[int]] = {}
        for c in got:
            by_stream.setdefault(c.event.stream, []).append(c.event.json()["n"])
        assert by_stream == {"a": [0, 1, 2], "b": [0, 1]}
        assert all(c.attempts == 0 and c.first_attempt_at is None for c in got)

    def test_claim_limit_caps_total(self, store: Store) -> None:
        """``limit`` caps the deliveries of one claim across lanes."""
        fill(store, {f"s{i}": 3 for i in range(5)})
        assert len(claim(store, limit=7, per_lane=3)) == 7

    def test_leased_lane_is_not_claimed_again_until_expiry(self, store: Store) -> None:
        """A leased lane is invisible to other claims until its lease runs out."""
        fill(store, {"a": 2})
        first = claim(store, per_lane=1)
        assert len(first) == 1
        assert claim(store, owner="r2", now=T0 + 1) == []
        assert store.next_due("d") == pytest.approx(T0 + LEASE)
        again = claim(store, owner="r2", per_lane=1, now=T0 + LEASE + 1)
        assert [c.delivery_id for c in again] == [first[0].delivery_id]

    def test_earliest_due_lane_first(self, store: Store) -> None:
        """Claims take the earliest-due lanes first."""
        fill(store, {"a": 1, "b": 1})
        got = claim(store, limit=1)
        store.settle("d", "r1", [Settlement(got[0].delivery_id, got[0].event.stream, "retry", 1, T0 + 5, "x")], T0)
        other = claim(store, limit=1, now=T0 + 10)
        assert other[0].event.stream != got[0].event.stream

    def test_only_contributing_lanes_are_leased(self, store: Store) -> None:
        """Lanes cut off by ``limit`` are not leased and stay claimable."""
        fill(store, {"a": 3, "b": 3})
        got = claim(store, limit=2, per_lane=5)
        assert len({c.event.stream for c in got}) == 1
        assert len(claim(store, owner="r2", now=T0 + 1)) == 3

    def test_release_relay_frees_leases(self, store: Store) -> None:
        """Releasing a relay makes its leased lanes claimable at once."""
        fill(store, {"a": 1})
        store.acquire_relay("r1")
        assert claim(store)
        store.release_relay("r1")
        assert len(claim(store, owner="r2", now=T0 + 1)) == 1


class TestSettle:
    def test_delivered_removes_work_and_counts(self, store: Store) -> None:
        """Delivered deliveries disappear, the lane goes, the counter grows."""
        fill(store, {"a": 2, "b": 1})
        deliver(store, claim(store))
        st = status(store)
        assert (st.pending, st.delivered) == (0, 3)
        assert store.next_due("d") is None

    def test_partial_delivery_keeps_the_rest_due(self, store: Store) -> None:
        """Delivering the head of a lane leaves the rest due now, in order."""
        fill(store, {"a": 3})
        got = claim(store)
        deliver(store, got[:1], now=T0 + 1)
        store.settle("d", "r1", [Settlement(c.delivery_id, "a", "hold") for c in got[1:]], T0 + 1)
        nxt = claim(store, now=T0 + 1)
        assert [c.event.json()["n"] for c in nxt] == [1, 2]

    def test_retry_records_attempt_and_delays_lane(self, store: Store) -> None:
        """A retry records the attempt and makes the lane due at the retry time."""
        fill(store, {"a": 2})
        got = claim(store, per_lane=1)
        store.settle("d", "r1", [Settlement(got[0].delivery_id, "a", "retry", 1, T0 + 10, "boom")], T0)
        assert store.next_due("d") == pytest.approx(T0 + 10)
        assert claim(store, now=T0 + 5) == []
        assert status(store).in_retry == 1
        again = claim(store, per_lane=1, now=T0 + 10)
        assert again[0].delivery_id == got[0].delivery_id
        assert again[0].attempts == 1 and again[0].first_attempt_at == pytest.approx(T0)

    def test_dead_letter_continues_the_stream(self, store: Store) -> None:
        """A dead delivery moves to the dead letters and the stream goes on."""
        fill(store, {"a": 2})
        got = claim(store, per_lane=1)
        store.settle("d", "r1", [Settlement(got[0].delivery_id, "a", "dead", 3, T0, "rejected: no")], T0)
        nxt = claim(store, now=T0)
        assert [c.event.json()["n"] for c in nxt] == [1]
        dls = store.dead_letters()
        assert len(dls) == 1
        dl = dls[0]
        assert (dl.event.id, dl.destination, dl.reason, dl.attempts, dl.state) == (
            got[0].event.id,
            "d",
            "rejected: no",
            3,
            "dead",
        )
        assert store.dead_letter(dl.id).event.id == dl.event.id
        st = status(store)
        assert (st.dead_lettered, st.pending) == (1, 1)

    def test_park_stops_the_lane(self, store: Store) -> None:
        """A parked delivery stops its lane until an operator acts."""
        fill(store, {"a": 2, "b": 1})
        got = claim(store, per_lane=1)
        head = next(c for c in got if c.event.stream == "a")
        store.settle("d", "r1", [Settlement(head.delivery_id, "a", "park", 2, T0, "exhausted")], T0)
        assert all(c.event.stream != "a" for c in claim(store, now=T0 + 1, owner="r2"))
        st = status(store)
        assert st.parked_streams == 1
        assert [d.state for d in store.dead_letters()] == ["parked"]

    def test_settle_by_a_relay_that_lost_its_lease_changes_nothing_for_the_new_owner(self, store: Store) -> None:
        """A late settle from a relay whose lease expired does not release the new owner's lane."""
        fill(store, {"a": 2})
        old = claim(store, per_lane=1, owner="old")
        new = claim(store, per_lane=1, owner="new", now=T0 + LEASE + 1)
        assert [c.delivery_id for c in new] == [old[0].delivery_id]
        deliver(store, old, owner="old", now=T0 + LEASE + 2)
        assert claim(store, owner="third", now=T0 + LEASE + 3) == []  # still leased by "new"
        deliver(store, new, owner="new", now=T0 + LEASE + 3)
        rest = claim(store, owner="third", now=T0 + LEASE + 4)
        assert [c.event.json()["n"] for c in rest] == [1]
        deliver(store, rest, owner="third")
        assert status(store).pending == 0 and store.next_due("d") is None


class TestOperator:
    def _dead(self, store: Store, kind: str = "dead") -> int:
        fill(store, {"a": 2})
        got = claim(store, per_lane=1)
        store.settle("d", "r1", [Settlement(got[0].delivery_id, "a", kind, 1, T0, "bad")], T0)  # type: ignore[arg-type]
        return store.dead_letters()[0].id

    def test_replay_dead_queues_again(self, store: Store) -> None:
        """Replaying a dead letter queues its event again and marks it replayed."""
        dl = self._dead(store)
        deliver(store, claim(store, now=T0 + 1), now=T0 + 1)
        assert store.replay_dead([dl], destination=None, now=T0 + 2) == 1
        got = claim(store, now=T0 + 2)
        assert [c.event.json()["n"] for c in got] == [0]
        assert store.dead_letters() == []
        assert [d.state for d in store.dead_letters(states=("replayed",))] == ["replayed"]

    def test_replay_parked_unparks_and_retries_head(self, store: Store) -> None:
        """Replaying a parked letter unparks the lane and retries its head first."""
        dl = self._dead(store, "park")
        assert store.replay_dead(None, destination="d", now=T0 + 1) == 1
        got = claim(store, now=T0 + 1)
        assert [(c.event.json()["n"], c.attempts) for c in got] == [(0, 0), (1, 0)]
        assert status(store).parked_streams == 0
        assert store.dead_letter(dl).state == "replayed"

    def test_replay_unknown_id_is_not_found(self, store: Store) -> None:
        """Replaying an id that is not a dead letter raises NotFoundError."""
        with pytest.raises(NotFoundError):
            store.replay_dead([424242], destination=None, now=T0)
        with pytest.raises(NotFoundError):
            store.dead_letter(424242)

    def test_purge_dead_and_parked(self, store: Store) -> None:
        """Purging deletes dead letters; purging a parked one drops it and unparks the lane."""
        self._dead(store, "park")
        assert store.purge_dead(None, destination=None) == 1
        assert store.dead_letters(states=("dead", "parked", "replayed")) == []
        got = claim(store, now=T0 + 1)
        assert [c.event.json()["n"] for c in got] == [1]
        assert status(store).pending == 1

    def test_status_errors_and_disable(self, store: Store) -> None:
        """Errors and the disabled flag are recorded per destination."""
        fill(store, {"a": 1})
        store.record_error("d", "broker down", T0)
        store.set_disabled("d", "auth failed", T0)
        st = store.status(["d"], T0 + 5)[0]
        assert (st.last_error, st.last_error_at, st.disabled) == ("broker down", T0, "auth failed")
        assert st.oldest_pending_age == pytest.approx(5)
        assert store.disabled("d") == "auth failed"
        store.set_disabled("d", None, T0)
        assert store.disabled("d") is None and store.disabled("other") is None

    def test_replay_stream_queues_history(self, store: Store) -> None:
        """replay_stream re-queues history after a sequence, one stream or all, in order."""
        fill(store, {"a": 3, "b": 1})
        deliver(store, claim(store))
        first_a = store.events(stream="a")[0].sequence or 0
        assert store.replay_stream("new", stream="a", after=first_a, now=T0) == 2
        got = claim(store, "new")
        assert [(c.event.stream, c.event.json()["n"]) for c in got] == [("a", 1), ("a", 2)]
        assert store.replay_stream("all", stream=None, after=0, now=T0) == 4

    def test_prune_keeps_what_is_needed(self, store: Store) -> None:
        """Pruning deletes only routed, old events no delivery or dead letter needs."""
        now = time.time()
        store.append([ev("done", 0), ev("pending", 0), ev("dead", 0)])
        store.route(to("d"), 100, T0)
        got = claim(store, limit=10)
        by = {c.event.stream: c for c in got}
        store.settle(
            "d",
            "r1",
            [
                Settlement(by["done"].delivery_id, "done", "delivered"),
                Settlement(by["dead"].delivery_id, "dead", "dead", 1, T0, "x"),
                Settlement(by["pending"].delivery_id, "pending", "hold"),
            ],
            T0,
        )
        store.append([ev("unrouted", 0)])
        assert store.prune(now - 3600) == 0  # too young
        assert store.prune(now + 3600) == 1
        assert sorted(e.stream for e in store.events()) == ["dead", "pending", "unrouted"]


class TestStaticRouting:
    """With no routes every event goes to every destination: stores route without decoding events
    (SQLite entirely in SQL). The outcome must be what the per-event router gives."""

    def test_every_destination_gets_every_event_in_order(self, store: Store) -> None:
        """In chunks of ``limit``: each destination's lanes hold their stream's events in order,
        pending counts add up, and nothing is routed twice."""
        from outrelay.core.relay.routing import Router

        events = store.append([ev(f"s{i % 3}", i) for i in range(25)])
        router = Router([], ["a", "b"])
        assert router.static_destinations == ("a", "b")
        routed = [store.route(router, 10, T0) for _ in range(4)]
        assert routed == [10, 10, 5, 0]
        for dest in ("a", "b"):
            assert status(store, dest).pending == 25
            got = claim(store, dest, limit=100, per_lane=100)
            for s in ("s0", "s1", "s2"):
                want = [e.id for e in events if e.stream == s]
                assert [c.event.id for c in got if c.event.stream == s] == want
            deliver(store, got, dest)
            assert status(store, dest).pending == 0

    def test_delivered_after_a_hold_in_one_stream(self, store: Store) -> None:
        """A settle where a stream has delivered, held and again delivered rows removes exactly
        the delivered ones; the held one is claimed next, first in its lane."""
        fill(store, {"s1": 4})
        c = claim(store, per_lane=4)
        kinds = ["delivered", "hold", "delivered", "delivered"]
        store.settle("d", "r1", [Settlement(x.delivery_id, "s1", k) for x, k in zip(c, kinds, strict=True)], T0)  # type: ignore[arg-type]
        assert status(store).pending == 1
        again = claim(store, per_lane=4)
        assert [x.delivery_id for x in again] == [c[1].delivery_id]
