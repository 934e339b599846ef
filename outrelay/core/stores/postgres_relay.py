"""Relay side of the PostgreSQL outbox: registration, routing, claiming and
settling (see :mod:`outrelay.core.stores.postgres` for the design).

Lane rows are always locked in (destination, stream) order — routing's
upsert, settling's re-lock — so concurrent relays cannot deadlock on them;
claims never wait (``SKIP LOCKED``).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from outrelay.core.envelope import Event
from outrelay.core.stores.base import Claimed, Settlement

if TYPE_CHECKING:
    import psycopg

    from outrelay.core.stores.postgres_schema import Names

    Cursor = psycopg.Cursor[Any]

__all__ = ["RelayMixin"]

T = TypeVar("T")


class RelayMixin:
    """Needs ``n``, ``notify``, ``_run``, ``_q`` and ``_event`` from the store."""

    n: Names
    notify: bool

    if TYPE_CHECKING:

        def _run(self, fn: Callable[[Cursor], T], *, reconnect: bool = True, relaxed: bool = False) -> T: ...
        def _q(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[Any]: ...
        @staticmethod
        def _event(seq: int, attrs: Any, data: bytes) -> Event: ...

    def acquire_relay(self, owner: str) -> None:
        """Register the relay (several may run; nothing is locked exclusively)."""
        self._q(
            f"INSERT INTO {self.n.relays} (owner, started_at) VALUES (%s, %s) "
            "ON CONFLICT (owner) DO UPDATE SET started_at = excluded.started_at RETURNING owner",
            (owner, time.time()),
        )

    def release_relay(self, owner: str) -> None:
        def fn(cur: Cursor) -> None:
            cur.execute(f"UPDATE {self.n.lanes} SET owner = NULL, due_at = 0 WHERE owner = %s", (owner,))
            cur.execute(f"DELETE FROM {self.n.relays} WHERE owner = %s", (owner,))

        self._run(fn)

    def route(self, router: Callable[[Event], Sequence[str]], limit: int, now: float) -> int:
        n = self.n

        def fn(cur: Cursor) -> int:
            cur.execute("SELECT pg_try_advisory_xact_lock(hashtext(%s))", (n.route_key,))
            if not cur.fetchone()[0]:  # type: ignore[index]
                return 0  # another relay is routing; it keeps the order
            static = getattr(router, "static_destinations", None)
            cols = "NULL, NULL" if static is not None else "attrs, data"  # no decoding when routes are static
            cur.execute(f"SELECT seq, stream, {cols} FROM {n.events} WHERE NOT routed ORDER BY seq LIMIT %s", (limit,))
            rows = cur.fetchall()
            if not rows:
                return 0
            dests: list[str] = []
            streams: list[str] = []
            seqs: list[int] = []
            lanes: dict[tuple[str, str], int] = {}
            for seq, stream, attrs, data in rows:
                for dest in static if static is not None else router(self._event(seq, attrs, data)):
                    dests.append(dest)
                    streams.append(stream)
                    seqs.append(seq)
                    lanes[(dest, stream)] = lanes.get((dest, stream), 0) + 1
            if dests:
                cur.execute(
                    f"INSERT INTO {n.deliveries} (destination, stream, event_seq, created_at) "
                    "SELECT d, s, e, %s FROM unnest(%s::text[], %s::text[], %s::bigint[]) "
                    "WITH ORDINALITY AS u(d, s, e, o) ORDER BY o",
                    (now, dests, streams, seqs),
                )
                keys = sorted(lanes)  # lock lanes in one global order: no deadlock with settle
                cur.execute(
                    f"INSERT INTO {n.lanes} (destination, stream, due_at, pending) "
                    "SELECT d, s, %s, c FROM unnest(%s::text[], %s::text[], %s::int[]) "
                    "WITH ORDINALITY AS u(d, s, c, o) ORDER BY o ON CONFLICT (destination, stream) "
                    f"DO UPDATE SET pending = {n.lanes}.pending + excluded.pending",
                    (now, [k[0] for k in keys], [k[1] for k in keys], [lanes[k] for k in keys]),
                )
                if self.notify:
                    cur.execute("SELECT pg_notify(%s, 'routed')", (n.channel,))
            cur.execute(f"UPDATE {n.events} SET routed = true WHERE seq = ANY(%s)", ([r[0] for r in rows],))
            return len(rows)

        return self._run(fn, relaxed=True)

    def claim(
        self,
        destination: str,
        *,
        limit: int,
        per_lane: int,
        owner: str,
        lease_seconds: float,
        now: float,
        max_bytes: int | None = None,
    ) -> list[Claimed]:
        n = self.n
        budget = max_bytes if max_bytes is not None else float("inf")

        def fn(cur: Cursor) -> list[Claimed]:
            cur.execute(
                f"SELECT stream FROM {n.lanes} WHERE destination = %s AND NOT parked AND due_at <= %s "
                "AND owner IS DISTINCT FROM %s ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED",
                (destination, now, owner, limit),
            )
            locked = [r[0] for r in cur.fetchall()]
            if not locked:
                return []
            # octet_length reads a TOASTed value's header only: sizes decide before any data is loaded
            cur.execute(
                "SELECT l.stream, d.id, d.attempts, d.first_attempt_at, e.seq, e.attrs, octet_length(e.data) "
                "FROM unnest(%s::text[]) WITH ORDINALITY AS l(stream, o) "
                "CROSS JOIN LATERAL (SELECT id, attempts, first_attempt_at, event_seq "
                f"  FROM {n.deliveries} WHERE destination = %s AND stream = l.stream ORDER BY id LIMIT %s) d "
                f"JOIN {n.events} e ON e.seq = d.event_seq ORDER BY l.o, d.id LIMIT %s",
                (locked, destination, per_lane, limit),
            )
            rows = cur.fetchall()
            present = {r[0] for r in rows}
            picked: list[Any] = []
            size = 0
            for row in rows:
                if picked and size + row[6] > budget:
                    break  # rows come lane by lane in order: what is picked is a prefix of each lane
                picked.append(row)
                size += row[6]
            leased = list(dict.fromkeys(r[0] for r in picked))
            if leased:
                cur.execute(
                    f"UPDATE {n.lanes} SET owner = %s, due_at = %s WHERE destination = %s AND stream = ANY(%s)",
                    (owner, now + lease_seconds, destination, leased),
                )
            empty = [s for s in locked if s not in present]
            if len(rows) < limit and empty:
                # a lane whose deliveries are gone (counter drift) would be "due" forever
                cur.execute(
                    f"DELETE FROM {n.lanes} l WHERE destination = %s AND stream = ANY(%s) AND NOT EXISTS "
                    f"(SELECT 1 FROM {n.deliveries} d WHERE d.destination = l.destination AND d.stream = l.stream)",
                    (destination, empty),
                )
            if not picked:
                return []
            cur.execute(f"SELECT seq, data FROM {n.events} WHERE seq = ANY(%s)", ([r[4] for r in picked],))
            data = dict(cur.fetchall())
            return [Claimed(r[1], self._event(r[4], r[5], data[r[4]]), r[2], r[3]) for r in picked]

        return self._run(fn, relaxed=True)

    def renew_leases(self, owner: str, lease_seconds: float, now: float) -> int:
        def fn(cur: Cursor) -> int:
            lanes = self.n.lanes
            cur.execute(  # lock in (destination, stream) order like route and settle: no deadlock with them
                f"UPDATE {lanes} l SET due_at = %s FROM (SELECT destination, stream FROM {lanes} WHERE owner = %s "
                "ORDER BY destination, stream FOR UPDATE) o WHERE l.destination = o.destination "
                "AND l.stream = o.stream AND l.owner = %s",
                (now + lease_seconds, owner, owner),
            )
            return cur.rowcount

        return self._run(fn, relaxed=True)

    def settle(self, destination: str, owner: str, settlements: Sequence[Settlement], now: float) -> None:
        if not settlements:
            return
        n = self.n

        def fn(cur: Cursor) -> None:
            cur.execute(
                f"SELECT stream FROM {n.lanes} WHERE destination = %s AND stream = ANY(%s) AND owner = %s "
                "ORDER BY stream FOR UPDATE",
                (destination, sorted({s.stream for s in settlements}), owner),
            )
            owned = {r[0] for r in cur.fetchall()}
            mine = [s for s in settlements if s.stream in owned]  # others: lease lost, the new owner resends
            lanes = {stream: [now, False, 0] for stream in owned}  # due_at, parked, removed
            gone: list[int] = []
            for s in mine:
                lane = lanes[s.stream]
                if s.kind == "delivered":
                    gone.append(s.delivery_id)
                elif s.kind == "retry":
                    cur.execute(
                        f"UPDATE {n.deliveries} SET attempts = %s, last_error = %s, "
                        "first_attempt_at = COALESCE(first_attempt_at, %s) WHERE id = %s",
                        (s.attempts, s.error, now, s.delivery_id),
                    )
                    lane[0] = max(lane[0], s.due_at)
                elif s.kind in ("dead", "park"):
                    cur.execute(
                        f"INSERT INTO {n.dead_letters} (event_seq, destination, stream, reason, attempts, "
                        "first_attempt_at, failed_at, state, delivery_id) "
                        "SELECT event_seq, %s, %s, %s, %s, COALESCE(first_attempt_at, %s), %s, %s, %s "
                        f"FROM {n.deliveries} WHERE id = %s",
                        (destination, s.stream, s.error or "", s.attempts, now, now,
                         "dead" if s.kind == "dead" else "parked",
                         s.delivery_id if s.kind == "park" else None, s.delivery_id),
                    )
                    if s.kind == "dead":
                        gone.append(s.delivery_id)
                    else:
                        cur.execute(
                            f"UPDATE {n.deliveries} SET attempts = %s, last_error = %s WHERE id = %s",
                            (s.attempts, s.error, s.delivery_id),
                        )
                        lane[1] = True
            if gone:
                cur.execute(f"DELETE FROM {n.deliveries} WHERE id = ANY(%s) RETURNING stream", (gone,))
                for (stream,) in cur.fetchall():
                    lanes[stream][2] += 1
            if lanes:
                keys = sorted(lanes)
                cur.execute(
                    f"UPDATE {n.lanes} l SET pending = l.pending - u.removed, owner = NULL, due_at = u.due, "
                    "parked = u.parked FROM unnest(%s::text[], %s::int[], %s::float8[], %s::bool[]) "
                    "AS u(stream, removed, due, parked) WHERE l.destination = %s AND l.stream = u.stream",
                    (keys, [lanes[k][2] for k in keys], [lanes[k][0] for k in keys], [lanes[k][1] for k in keys],
                     destination),
                )
                cur.execute(
                    f"DELETE FROM {n.lanes} WHERE destination = %s AND stream = ANY(%s) AND pending <= 0",
                    (destination, keys),
                )
            delivered = sum(1 for s in mine if s.kind == "delivered")
            if delivered:
                cur.execute(
                    f"INSERT INTO {n.destinations} (destination, delivered) VALUES (%s, %s) ON CONFLICT (destination) "
                    f"DO UPDATE SET delivered = {n.destinations}.delivered + excluded.delivered",
                    (destination, delivered),
                )

        self._run(fn, relaxed=True)

    def next_due(self, destination: str) -> float | None:
        row = self._q(f"SELECT MIN(due_at) FROM {self.n.lanes} WHERE destination = %s AND NOT parked", (destination,))
        return None if row[0][0] is None else float(row[0][0])

    def unrouted(self) -> int:
        return int(self._q(f"SELECT COUNT(*) FROM {self.n.events} WHERE NOT routed")[0][0])

