"""Lanes waiting for a retry: listed with attempts, next attempt and error; made due now on demand."""

from __future__ import annotations

from outrelay.core.model.envelope import Event
from outrelay.core.stores.base import Settlement, Store
from outrelay.core.stores.lanes import LaneOperations

T0 = 1_000_000.0


def _fail_heads(store: Store, due: dict[str, float]) -> None:
    """Append one event per stream of ``due`` (two on "a"), route them to "d", and settle each lane's head as a
    retry due at the given time; stream "p" is parked instead."""
    store.append([Event(type="t", stream=s) for s in [*due, "a", "p"]])
    store.route(lambda e: ["d"], 100, T0)
    claimed = store.claim("d", limit=100, per_lane=1, owner="t", lease_seconds=30, now=T0)
    settle = []
    for c in claimed:
        if c.event.stream == "p":
            settle.append(Settlement(c.delivery_id, "p", "park", attempts=1, error="refused for good"))
        else:
            settle.append(
                Settlement(c.delivery_id, c.event.stream, "retry", attempts=3, due_at=due[c.event.stream], error="503")
            )
    store.settle("d", "t", settle, T0)


def test_stuck_streams_lists_waiting_lanes_soonest_first(store: Store) -> None:
    """Each lane whose head waits for a retry is listed once with its pending count, attempts, next attempt and
    last error, soonest first; a parked lane is not listed (it is a parked dead letter)."""
    assert isinstance(store, LaneOperations)
    _fail_heads(store, {"a": T0 + 300, "b": T0 + 60})
    stuck = store.stuck_streams("d")
    assert [(s.stream, s.pending, s.attempts, s.next_attempt_at, s.last_error) for s in stuck] == [
        ("b", 1, 3, T0 + 60, "503"),
        ("a", 2, 3, T0 + 300, "503"),
    ]
    assert [d.event.stream for d in store.dead_letters(destination="d", states=("parked",))] == ["p"]
    assert store.stuck_streams("d", limit=1)[0].stream == "b"
    assert store.stuck_streams("other") == []


def test_retry_now_makes_waiting_lanes_due(store: Store) -> None:
    """retry_now moves one stream's (or every) waiting lane to now, so the next claim takes it; parked lanes stay."""
    assert isinstance(store, LaneOperations)
    _fail_heads(store, {"a": T0 + 300, "b": T0 + 60})
    now = T0 + 1
    assert store.claim("d", limit=10, per_lane=1, owner="t", lease_seconds=30, now=now) == []
    assert store.retry_now("d", stream="b", now=now) == 1
    got = store.claim("d", limit=10, per_lane=1, owner="t", lease_seconds=30, now=now)
    assert [c.event.stream for c in got] == ["b"]
    assert store.stuck_streams("d")[0].stream == "a"  # "b" is being sent (leased): not waiting
    assert store.retry_now("d", stream=None, now=now) == 1  # "a" only: "b" is leased, "p" parked
    assert store.retry_now("d", stream="nosuch", now=now) == 0
    got = store.claim("d", limit=10, per_lane=1, owner="t2", lease_seconds=30, now=now)
    assert [c.event.stream for c in got] == ["a"]
