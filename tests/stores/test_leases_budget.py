"""Lease renewal, no re-claim by the holder, and byte-bounded claims, on SQLite and PostgreSQL alike."""

from __future__ import annotations

from outrelay import Event
from outrelay.core.stores.base import Claimed, Settlement, Store

T0 = 1_000_000.0
LEASE = 30.0


def fill(store: Store, sizes: list[tuple[str, int]]) -> None:
    """Append one event per (stream, data size) in order and route it to destination ``d``."""
    store.append([Event(type="t.x", stream=s, data=b"x" * n) for s, n in sizes])
    store.route(lambda e: ["d"], 10_000, T0)


def claim(store: Store, *, owner: str = "r1", now: float = T0, max_bytes: int | None = None) -> list[Claimed]:
    return store.claim("d", limit=100, per_lane=10, owner=owner, lease_seconds=LEASE, now=now, max_bytes=max_bytes)


class TestLeases:
    def test_holder_never_reclaims_its_lane_after_due(self, store: Store) -> None:
        """A lane whose lease ran out is not claimed again by the relay holding it, only by another one."""
        fill(store, [("s1", 10)])
        assert len(claim(store)) == 1
        later = T0 + LEASE + 1
        assert claim(store, now=later) == []
        taken = claim(store, owner="r2", now=later)
        assert [c.event.stream for c in taken] == ["s1"]

    def test_renew_keeps_lanes_from_other_relays(self, store: Store) -> None:
        """renew_leases pushes every lane the owner holds past the old expiry, so no one else claims it."""
        fill(store, [("s1", 10), ("s2", 10)])
        assert len(claim(store)) == 2
        assert store.renew_leases("r1", LEASE, T0 + LEASE - 1) == 2
        assert claim(store, owner="r2", now=T0 + LEASE + 1) == []
        assert len(claim(store, owner="r2", now=T0 + 2 * LEASE)) == 2

    def test_renew_touches_only_the_owners_lanes(self, store: Store) -> None:
        """Lanes of other owners and released lanes are not renewed."""
        fill(store, [("s1", 10), ("s2", 10)])
        mine = claim(store)
        store.settle("d", "r1", [Settlement(mine[0].delivery_id, mine[0].event.stream, "hold")], T0)
        assert store.renew_leases("r1", LEASE, T0) == 1
        assert store.renew_leases("nobody", LEASE, T0) == 0


class TestByteBudget:
    def test_claim_stops_at_the_byte_budget(self, store: Store) -> None:
        """A claim returns deliveries until the next would exceed max_bytes, keeping each lane a prefix."""
        fill(store, [("a", 400), ("a", 400), ("b", 300), ("a", 300)])
        got = claim(store, max_bytes=1000)
        assert [(c.event.stream, len(c.event.data)) for c in got] == [("a", 400), ("a", 400)]
        rest = claim(store, max_bytes=1000)  # lane a is leased; b is free
        assert [(c.event.stream, len(c.event.data)) for c in rest] == [("b", 300)]

    def test_an_event_larger_than_the_budget_goes_alone(self, store: Store) -> None:
        """The first delivery always comes, however large, and nothing after it."""
        fill(store, [("a", 5000), ("b", 10)])
        got = claim(store, max_bytes=100)
        assert [len(c.event.data) for c in got] == [5000]

    def test_unleased_lanes_stay_claimable(self, store: Store) -> None:
        """A lane left out by the budget is not leased: the next claim takes it at once."""
        fill(store, [("a", 600), ("b", 600)])
        assert [c.event.stream for c in claim(store, max_bytes=1000)] == ["a"]
        assert [c.event.stream for c in claim(store, owner="r2", max_bytes=1000)] == ["b"]

    def test_without_budget_everything_due_is_claimed(self, store: Store) -> None:
        """max_bytes=None claims as before: up to limit and per_lane."""
        fill(store, [("a", 600), ("b", 600), ("a", 600)])
        assert len(claim(store)) == 3
