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

from outrelay.core.model.envelope import Event
from outrelay.core.stores.base import Attempt, Claimed, Settlement
from outrelay.core.stores.postgres_attempts import attempt_args
from outrelay.core.stores.postgres_script import Statement, statement

if TYPE_CHECKING:
    import psycopg

    from outrelay.core.stores.audit_chain import Chain
    from outrelay.core.stores.postgres_schema import Names

    Cursor = psycopg.Cursor[Any]

__all__ = ["RelayMixin"]

T = TypeVar("T")


class RelayMixin:
    """Needs ``n``, ``notify``, ``_run``, ``_q``, ``_event`` and ``_routed_here`` from the store."""

    n: Names
    notify: bool
    #: per destination: did its last claim come back full (then the next one skips the due-lane read)
    _claims_full: dict[str, bool]

    if TYPE_CHECKING:

        def _run(
            self, fn: Callable[[Cursor], T], *, reconnect: bool = True, relaxed: bool = False,
            first: str = "", finish: Callable[[T], str] | None = None,
        ) -> T: ...  # fmt: skip
        def _routed_here(self) -> None: ...
        def _script(self, statements: Sequence[Statement], args: dict[str, Any]) -> list[list[Any]]: ...
        def forget_quiet(self) -> None: ...
        def _know_quiet(self, destination: str, version: int, due: float | None, read_at: float) -> None: ...
        def _lower_quiet(self, destination: str, due: float) -> None: ...

        _quiet_version: int

        def _q(self, sql: str, args: Sequence[Any] | dict[str, Any] = (), *, single: bool = False) -> list[Any]: ...
        @staticmethod
        def _event(seq: int, attrs: Any, data: bytes) -> Event: ...

        # the audit chain (outrelay.core.stores.postgres_audit)
        audit: Chain | None

        def _audit_unrouted(self, cur: Cursor, limit: int) -> list[tuple[int, str]]: ...
        def _audit_routed(self, cur: Cursor, routed: Sequence[tuple[int, str]], at: float) -> None: ...
        def _audit_settle_read(self, cur: Cursor, settlements: Sequence[Settlement]) -> dict[int, tuple[int, str]]: ...
        def _audit_settled(
            self, cur: Cursor, destination: str, settlements: Sequence[Settlement],
            found: dict[int, tuple[int, str]], at: float,
        ) -> None: ...  # fmt: skip

        # the delivery-attempt log (outrelay.core.stores.postgres_attempts)
        def _attempts_statement(self) -> Statement: ...

        attempts_keep: int | None

        def _log_attempts(self, cur: Cursor, destination: str, logged: tuple[dict[str, Any], list[int]]) -> None: ...

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
        dests = self._static(router)
        if dests is not None:
            return self._route_script(dests, limit, now, None, {})[0]
        return self._routing_tx(router, limit, now, lambda cur: [])[0]

    def _static(self, router: Callable[[Event], Sequence[str]]) -> list[str] | None:
        """The destinations of every event when routing needs no event (static routes, at least one
        destination) and no audit chain records it; else None."""
        static = getattr(router, "static_destinations", None)
        return list(static) if static and self.audit is None else None

    def route_and_claim(
        self, router: Callable[[Event], Sequence[str]], route_limit: int, destination: str, **claim: Any
    ) -> tuple[int, list[Claimed]]:
        """:meth:`route` then :meth:`claim` in one transaction: what a relay does when an
        append wakes it, without the hop between the two (the destination that claims
        routes for every destination). Routing is skipped when another relay routes at
        that moment; it is not offered with the audit chain on (its records of routing
        and claiming are kept in separate transactions). Returns (routed, claimed).

        Locks: routing takes the lanes in (destination, stream) order as always, and the
        claim that follows waits for none (``SKIP LOCKED``; rows this transaction holds are
        not skipped), so no deadlock is added. A failure rolls both back: nothing is routed
        by a claim that failed.

        :raises RuntimeError: the audit chain is on.
        :raises StoreError: as :meth:`route` and :meth:`claim`."""
        if self.audit is not None:
            raise RuntimeError("route_and_claim is not offered with the audit chain on; route, then claim")
        now = claim["now"]
        dests = self._static(router)
        if dests is not None and not self._claims_full.get(destination):
            return self._route_script(dests, route_limit, now, destination, claim)
        return self._routing_tx(router, route_limit, now, lambda cur: self._claim_in(cur, destination, **claim))

    def _route_script(
        self, dests: list[str], limit: int, now: float, destination: str | None, claim: dict[str, Any]
    ) -> tuple[int, list[Claimed]]:
        """Static routing (and, given ``destination``, its claim) as one message: one round trip from
        commit to claimed (see :meth:`PostgresStore._script`). The routing statement takes the advisory
        lock itself and routes nothing when another relay holds it; it notifies ``routed`` when it
        routed anything."""
        version = self._quiet_version
        script = self._scripts()
        statements = [script["route"]]
        args: dict[str, Any] = {"rlim": limit, "dests": dests, "now": now}
        if destination is not None:
            statements += script["claim"]
            args.update(self._claim_args(destination, **claim))
        results = self._script(statements, args)
        routed = int(results[0][0][0])
        if routed:
            self.forget_quiet()  # every destination has new lanes (this one's claim below saw them)
            version += 1
            if self.notify:
                self._routed_here()
        if destination is None:
            return routed, []
        return routed, self._claimed_script(results[1:], destination, claim["limit"], version, now)

    def _scripts(self) -> dict[str, Any]:
        """This store's script statements (see :mod:`.postgres_script`), built once: ``route``, and the
        lists ``claim`` (lock, claim, next due) and ``settle`` (lock, settle)."""
        built: dict[str, Any] | None = getattr(self, "_built_scripts", None)
        if built is None:
            n = self.n
            note = f"pg_notify('{n.channel}', 'routed')"
            notify = f", nt AS MATERIALIZED (SELECT {note} FROM (SELECT 1 FROM sel LIMIT 1) x)" if self.notify else ""
            noted = ", (SELECT count(*) FROM nt)" if self.notify else ""  # a CTE nothing reads never runs
            due = (
                f"SELECT min(due_at) FROM {n.lanes} WHERE destination = %(dest)s AND NOT parked "
                "AND owner IS DISTINCT FROM %(owner)s"
            )
            built = {
                "route": statement(
                    "outrelay_route", _ROUTE_SCRIPT.format(n=n, fan=_ROUTE_FAN.format(n=n), notify=notify, noted=noted)
                ),
                "claim": [
                    statement("outrelay_lock", _LOCK_SCRIPT.format(n=n)),
                    statement("outrelay_claim", _CLAIM_SQL.format(n=n, locked=_LOCKED)),
                    statement("outrelay_due", due),
                ],
                "settle": [
                    statement("outrelay_own", _OWN_SCRIPT.format(n=n)),
                    statement("outrelay_settle", _SETTLE_SQL.format(n=n, owned=_OWNED)),
                ],
            }
            self._built_scripts = built
        return built

    def _routing_tx(
        self,
        router: Callable[[Event], Sequence[str]],
        limit: int,
        now: float,
        then: Callable[[Cursor], list[Claimed]],
    ) -> tuple[int, list[Claimed]]:
        """One transaction: take the routing lock (skipped, routing 0, when another relay holds it),
        route up to ``limit`` events, then ``then(cur)``; notify ``routed`` as it commits and wake this
        process's listeners after."""

        def fn(cur: Cursor) -> tuple[int, list[Claimed]]:
            locked = cur.fetchone()[0]  # type: ignore[index]  # the advisory lock (first)
            routed = self._route_locked(cur, router, limit, now) if locked else 0  # else: that relay keeps the order
            return routed, then(cur)

        routed, claimed = self._run(
            fn, relaxed=True, first=self._route_lock(), finish=lambda result: self._routed_note(result[0])
        )
        if routed:
            self.forget_quiet()
            if self.notify:
                self._routed_here()
        return routed, claimed

    def _route_lock(self) -> str:
        # taken in the message that begins the transaction (fixed text: the names are validated identifiers)
        return f"SELECT pg_try_advisory_xact_lock(hashtext('{self.n.route_key}'))"

    def _routed_note(self, count: int) -> str:
        """The NOTIFY sent in the message that commits a routing that routed ``count`` events."""
        return f"SELECT pg_notify('{self.n.channel}', 'routed')" if count and self.notify else ""

    def _route_locked(self, cur: Cursor, router: Callable[[Event], Sequence[str]], limit: int, now: float) -> int:
        """Route up to ``limit`` events; the caller holds the routing lock."""
        static = getattr(router, "static_destinations", None)
        # with the audit chain on, route exactly the events it records
        audited = self._audit_unrouted(cur, limit) if self.audit is not None else None
        only = None if audited is None else [a[0] for a in audited]
        if static is not None:
            count = self._route_static(cur, list(static), limit, now, only)
        else:
            count = self._route_decoding(cur, router, limit, now, only)
        if audited:
            self._audit_routed(cur, audited, now)
        return count

    def _route_static(
        self, cur: Cursor, dests: list[str], limit: int, now: float, only: list[int] | None = None
    ) -> int:
        """Every event to every destination: no event row is read at all.

        One statement (one round trip, on the path from commit to send when a
        claim routes) takes the events from the routing queue (its rows carry
        the stream), inserts their deliveries (ids of a lane ascend with
        ``seq``) and upserts the lanes with their new counts in (destination,
        stream) order, like everywhere else; it returns how many events it
        took. The lanes are locked last and stay locked until the transaction
        ends: a locked lane is skipped by claims and blocks settles."""
        n = self.n
        pick = "" if only is None else "WHERE seq = ANY(%(only)s) "
        # = ANY(ARRAY(...)), not IN (SELECT ...): with IN the planner hash-joins a sequential scan of the
        # whole queue (a backlog of 200,000: 51 ms per routing of 2,000 instead of 3.8 ms)
        take = (
            f"DELETE FROM {n.unrouted} WHERE seq = ANY(ARRAY(SELECT seq FROM {n.unrouted} {pick}"
            "ORDER BY seq LIMIT %(lim)s)) RETURNING seq, stream"
        )
        if not dests:  # routed nowhere: only taken off the queue
            cur.execute(take, {"lim": limit, "only": only})
            return cur.rowcount
        cur.execute(
            f"WITH sel AS MATERIALIZED ({take}), {_ROUTE_FAN.format(n=n)} SELECT count(*) FROM sel",
            {"lim": limit, "dests": dests, "now": now, "only": only},
        )
        return int(cur.fetchone()[0])  # type: ignore[index]

    def _upsert_lanes(self, cur: Cursor, dests: list[str], streams: list[str], counts: list[int], now: float) -> None:
        """Add ``counts`` pending deliveries to the lanes, given in (destination, stream) order."""
        n = self.n
        cur.execute(
            f"INSERT INTO {n.lanes} (destination, stream, due_at, pending) "
            "SELECT d, s, %s, c FROM unnest(%s::text[], %s::text[], %s::int[]) "
            "WITH ORDINALITY AS u(d, s, c, o) ORDER BY o ON CONFLICT (destination, stream) "
            f"DO UPDATE SET pending = {n.lanes}.pending + excluded.pending",
            (now, dests, streams, counts),
        )

    def _route_decoding(
        self,
        cur: Cursor,
        router: Callable[[Event], Sequence[str]],
        limit: int,
        now: float,
        only: list[int] | None = None,
    ) -> int:
        """Route events one by one through ``router`` (content-based routes); only
        the sequences ``only``, when given. ``router`` is given each event's envelope with
        empty ``data``: no payload is read or decoded."""
        n = self.n
        pick = "" if only is None else "WHERE u.seq = ANY(%(only)s) "
        # the envelope only: routes match on its fields, and reading the payloads of a routing
        # batch (2,000 x 1 MB) held them all in memory at once
        cur.execute(
            f"SELECT u.seq, u.stream, e.attrs FROM {n.unrouted} u JOIN {n.events} e ON e.seq = u.seq "
            f"{pick}ORDER BY u.seq LIMIT %(lim)s",
            {"lim": limit, "only": only},
        )
        rows = cur.fetchall()
        if not rows:
            return 0
        dests: list[str] = []
        streams: list[str] = []
        seqs: list[int] = []
        lanes: dict[tuple[str, str], int] = {}
        for seq, stream, attrs in rows:
            for dest in router(self._event(seq, attrs, b"")):
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
        cur.execute(f"DELETE FROM {n.unrouted} WHERE seq = ANY(%s)", ([r[0] for r in rows],))
        if lanes:
            keys = sorted(lanes)  # lock lanes in one global order, last: no deadlock with settle, short waits
            self._upsert_lanes(cur, [k[0] for k in keys], [k[1] for k in keys], [lanes[k] for k in keys], now)
        return len(rows)

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
        """Two statements: lock due lanes (``SKIP LOCKED``); then, in a
        snapshot taken after the lock (so it sees every delivery committed to
        those lanes), take each lane's first deliveries, keep the prefix within
        ``max_bytes`` (sizes from ``octet_length``, which reads a TOASTed
        value's header only), lease the lanes that contributed, drop lanes
        found empty, and return the picked rows with their data (binary
        protocol: no hex-encoded bytea).

        After a claim that was not full (a trickle of appends, the end of a
        backlog), the claim is one message instead (see :meth:`_script`): the
        same two statements and a read of when the next lane is due, which
        :meth:`quiet_until` then answers from; results in the text format,
        which is cheap for the few events such a claim finds. With the audit
        chain on, a read first asks whether any lane is due at all."""
        args = self._claim_args(
            destination, limit=limit, per_lane=per_lane, owner=owner, lease_seconds=lease_seconds, now=now,
            max_bytes=max_bytes,
        )  # fmt: skip
        if self.audit is None and not self._claims_full.get(destination):
            version = self._quiet_version
            results = self._script(self._scripts()["claim"], args)
            return self._claimed_script(results, destination, limit, version, now)
        if not self._claims_full.get(destination) and not self._q(
            f"SELECT 1 FROM {self.n.lanes} WHERE {_DUE_LANE} LIMIT 1", (destination, now, owner), single=True
        ):
            return []
        claimed = self._run(lambda cur: self._claim_locked(cur, args), relaxed=True)
        self._claims_full[destination] = len(claimed) >= limit  # a hint only: a race costs one round trip
        self._lower_quiet(destination, 0.0)  # full, or no hint taken: the next claim asks the database
        if self.audit is not None:  # settling then describes the batch without reading it again
            self.audit.remember(claimed)
        return claimed

    def _claim_in(self, cur: Cursor, destination: str, **claim: Any) -> list[Claimed]:
        """:meth:`claim`'s two statements, in the caller's transaction."""
        return self._claim_locked(cur, self._claim_args(destination, **claim))

    def _claim_locked(self, cur: Cursor, args: dict[str, Any]) -> list[Claimed]:
        """:meth:`claim`'s two statements (arguments from :meth:`_claim_args`), in the caller's transaction."""
        n = self.n
        cur.execute(
            f"SELECT stream FROM {n.lanes} WHERE {_DUE_LANE} ORDER BY due_at LIMIT %s FOR UPDATE SKIP LOCKED",
            (args["dest"], args["now"], args["owner"], args["lim"]),
        )
        locked = [r[0] for r in cur]
        if not locked:
            return []
        cur.execute(_CLAIM_SQL.format(n=n, locked="%(locked)s::text[]"), {**args, "locked": locked}, binary=True)
        return _decoded(cur)

    @staticmethod
    def _claim_args(
        destination: str, *, limit: int, per_lane: int, owner: str, lease_seconds: float, now: float,
        max_bytes: int | None = None,
    ) -> dict[str, Any]:  # fmt: skip
        return {
            "dest": destination, "owner": owner, "lim": limit, "per_lane": per_lane, "now": now,
            "until": now + lease_seconds, "budget": max_bytes if max_bytes is not None else 2**62,
        }  # fmt: skip

    def _claimed_script(
        self, results: list[list[Any]], destination: str, limit: int, version: int, now: float
    ) -> list[Claimed]:
        """The claim of the results of the script's ``claim`` statements (lock the due lanes, their names
        kept in the transaction's ``outrelay.lanes`` setting; claim from them in a snapshot taken after
        the lock, as :meth:`_claim_in` does; read when the next lane this relay does not hold is due).
        After a claim that was not full, remembers when the next lane is due (see ``quiet_until``)."""
        claimed = _decoded(results[1])
        full = len(claimed) >= limit
        self._claims_full[destination] = full
        if full:
            self._lower_quiet(destination, 0.0)
        else:
            due = None if results[2][0][0] is None else float(results[2][0][0])
            if not claimed and due is not None and due <= now:  # due lanes another relay's transaction held
                due = now + _CONTENDED
            self._know_quiet(destination, version, due, now)
        return claimed

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

    def settle(
        self,
        destination: str,
        owner: str,
        settlements: Sequence[Settlement],
        now: float,
        attempts: Sequence[Attempt] = (),
    ) -> None:
        """Two statements: lock the lanes still leased by ``owner`` (in stream
        order); then, in a snapshot that sees every commit before the lock,
        record retries and dead letters (rare: ``executemany``), delete the
        delivered and dead deliveries by primary key, release or drop the
        lanes and count the delivered."""
        if not settlements:
            return
        lanes: dict[str, list[Any]] = {}  # stream -> [due_at, parked]
        gone: list[Settlement] = []  # delivered first, then dead
        dead: list[Settlement] = []
        slow: list[Settlement] = []
        for s in settlements:
            lane = lanes.setdefault(s.stream, [now, False])
            if s.kind == "delivered":
                gone.append(s)
            elif s.kind != "hold":
                slow.append(s)
                if s.kind == "retry":
                    lane[0] = max(lane[0], s.due_at)
                elif s.kind == "dead":
                    dead.append(s)
                else:
                    lane[1] = True
        ok = [True] * len(gone) + [False] * len(dead)
        gone += dead
        keys = sorted(lanes)
        args = {
            "dest": destination, "streams": keys, "due": [lanes[k][0] for k in keys],
            "parked": [lanes[k][1] for k in keys], "gone": [s.delivery_id for s in gone], "ok": ok,
            "gone_streams": [s.stream for s in gone], "now": now,
        }  # fmt: skip

        logged = attempt_args(attempts, self.attempts_keep)  # the delivery-attempt log, same transaction
        if not slow and self.audit is None and not (logged and logged[1]):  # [1]: events to trim first
            script = self._scripts()["settle"]  # every outcome delivered: one message (see _script)
            if logged:
                script, args = [*script, self._attempts_statement()], {**args, **logged[0]}
            kept = self._script(script, {**args, "owner": owner})[1][0][0]
        else:
            kept = self._run(
                lambda cur: self._settle_in(cur, destination, owner, settlements, slow, args, logged), relaxed=True
            )
        if kept is not None:  # a lane still has deliveries: it is due again
            self._lower_quiet(destination, float(kept))

    def _settle_in(
        self, cur: Cursor, destination: str, owner: str, settlements: Sequence[Settlement],
        slow: list[Settlement], args: dict[str, Any], logged: tuple[dict[str, Any], list[int]] | None = None,
    ) -> float | None:  # fmt: skip
        """:meth:`settle` a statement at a time (failures to record, or the audit chain on); returns
        when the earliest lane it kept pending is due (None: none kept)."""
        n = self.n
        now = args["now"]
        cur.execute(
            f"SELECT stream FROM {n.lanes} WHERE destination = %s AND stream = ANY(%s) AND owner = %s "
            "ORDER BY stream FOR UPDATE",
            (destination, args["streams"], owner),
        )
        owned = [r[0] for r in cur]  # others: lease lost, the new owner sends them again
        if logged:  # attempts happened, whoever holds the lanes now
            self._log_attempts(cur, destination, logged)
        if not owned:
            return None
        if slow:
            self._record(cur, destination, [s for s in slow if s.stream in set(owned)], now)
        mine = [s for s in settlements if s.stream in set(owned)] if self.audit is not None else []
        found = self._audit_settle_read(cur, mine) if mine else {}
        cur.execute(_SETTLE_SQL.format(n=n, owned="%(owned)s::text[]"), {**args, "owned": owned})
        kept = cur.fetchone()[0]  # type: ignore[index]
        if found:  # last: the audit lock is held only while this transaction commits
            self._audit_settled(cur, destination, mine, found, now)
        return None if kept is None else float(kept)

    def _record(self, cur: Cursor, destination: str, slow: Sequence[Settlement], now: float) -> None:
        """Attempts of retried/parked deliveries and dead-letter rows (before their deliveries go)."""
        n = self.n
        retries = [(s.attempts, s.error, now, s.delivery_id) for s in slow if s.kind == "retry"]
        if retries:
            cur.executemany(
                f"UPDATE {n.deliveries} SET attempts = %s, last_error = %s, "
                "first_attempt_at = COALESCE(first_attempt_at, %s) WHERE id = %s",
                retries,
            )
        dead = [
            (destination, s.stream, s.error or "", s.attempts, now, now, "dead" if s.kind == "dead" else "parked",
             s.delivery_id if s.kind == "park" else None, s.delivery_id)
            for s in slow if s.kind in ("dead", "park")
        ]  # fmt: skip
        if dead:
            cur.executemany(
                f"INSERT INTO {n.dead_letters} (event_seq, destination, stream, reason, attempts, "
                "first_attempt_at, failed_at, state, delivery_id) "
                "SELECT event_seq, %s, %s, %s, %s, COALESCE(first_attempt_at, %s), %s, %s, %s "
                f"FROM {n.deliveries} WHERE id = %s",
                dead,
            )
        parks = [(s.attempts, s.error, s.delivery_id) for s in slow if s.kind == "park"]
        if parks:
            cur.executemany(f"UPDATE {n.deliveries} SET attempts = %s, last_error = %s WHERE id = %s", parks)

    def next_due(self, destination: str) -> float | None:
        row = self._q(
            f"SELECT MIN(due_at) FROM {self.n.lanes} WHERE destination = %s AND NOT parked", (destination,), single=True
        )
        return None if row[0][0] is None else float(row[0][0])

    def leased_elsewhere(self, destination: str, owner: str, now: float) -> float | None:
        row = self._q(
            f"SELECT MAX(due_at) FROM {self.n.lanes} WHERE destination = %s AND owner IS NOT NULL "
            "AND owner <> %s AND due_at > %s",
            (destination, owner, now),
            single=True,
        )
        return None if row[0][0] is None else float(row[0][0])

    def unrouted(self) -> int:
        return int(self._q(f"SELECT COUNT(*) FROM {self.n.unrouted}")[0][0])


#: seconds a claim that found nothing waits before trying again lanes that were due but locked by another
#: relay (its claim or settle; it usually takes them itself next): several relays draining one outbox
#: would otherwise spin on them, a claim a millisecond each
_CONTENDED = 0.02

#: a lane ``claim`` may take: (destination, now, owner) — its due-lane read and its lock use the same test
_DUE_LANE = "destination = %s AND NOT parked AND due_at <= %s AND owner IS DISTINCT FROM %s"


def _decoded(rows: Any) -> list[Claimed]:
    """The claimed deliveries of the rows of :data:`_CLAIM_SQL` (a cursor or a list)."""
    decode = Event.from_attributes
    return [Claimed(d_id, decode(attrs, data, seq), att, first) for d_id, att, first, seq, attrs, data in rows]


#: the fan-out of routed events ``sel`` (seq, stream) to ``%(dests)s``: their deliveries (ids of a lane
#: ascend with seq), then the lanes with their new counts, in (destination, stream) order
_ROUTE_FAN = (
    "fan AS MATERIALIZED (SELECT u.d, sel.stream, sel.seq FROM sel CROSS JOIN unnest(%(dests)s::text[]) u(d)), "
    "ins AS (INSERT INTO {n.deliveries} (destination, stream, event_seq, created_at) "
    "  SELECT d, stream, seq, %(now)s FROM fan ORDER BY d, seq RETURNING destination, stream), "
    # reading ins makes the deliveries go in first: the lanes are locked last, for the shortest time
    # (PostgreSQL would otherwise run an unread data-modifying CTE in any order, this one first)
    "up AS (INSERT INTO {n.lanes} (destination, stream, due_at, pending) "
    "  SELECT destination, stream, %(now)s, count(*) FROM ins GROUP BY destination, stream "
    "  ORDER BY destination, stream "
    "  ON CONFLICT (destination, stream) DO UPDATE SET pending = {n.lanes}.pending + excluded.pending)"
)

#: static routing as one statement of a script: the advisory lock (nothing is routed when another relay
#: holds it), up to ``%(rlim)s`` events off the routing queue, ``{fan}`` (:data:`_ROUTE_FAN`), and
#: ``{notify}`` (a CTE that notifies ``routed`` when anything was routed, or nothing); returns the count
_ROUTE_SCRIPT = (
    "WITH lk AS MATERIALIZED (SELECT pg_try_advisory_xact_lock(hashtext('{n.route_key}')) AS ok), "
    "sel AS MATERIALIZED (DELETE FROM {n.unrouted} WHERE (SELECT ok FROM lk) "
    "  AND seq = ANY(ARRAY(SELECT seq FROM {n.unrouted} ORDER BY seq LIMIT %(rlim)s)) RETURNING seq, stream), "
    "{fan}{notify} SELECT (SELECT count(*) FROM sel){noted}"
)

#: claim's lock as a statement of a script: the due lanes' names go to the setting ``outrelay.lanes``
_LOCK_SCRIPT = (
    "SELECT set_config('outrelay.lanes', COALESCE((SELECT array_agg(stream ORDER BY due_at)::text FROM "
    "  (SELECT stream, due_at FROM {n.lanes} WHERE destination = %(dest)s AND NOT parked AND due_at <= %(now)s "
    "   AND owner IS DISTINCT FROM %(owner)s ORDER BY due_at LIMIT %(lim)s FOR UPDATE SKIP LOCKED) s), '{{}}'), true)"
)
_LOCKED = "current_setting('outrelay.lanes')::text[]"

#: settle's lock as a statement of a script: the lanes still leased go to the setting ``outrelay.owned``
_OWN_SCRIPT = (
    "SELECT set_config('outrelay.owned', COALESCE((SELECT array_agg(stream)::text FROM "
    "  (SELECT stream FROM {n.lanes} WHERE destination = %(dest)s AND stream = ANY(%(streams)s::text[]) "
    "   AND owner = %(owner)s ORDER BY stream FOR UPDATE) s), '{{}}'), true)"
)
_OWNED = "current_setting('outrelay.owned')::text[]"

#: claim's second statement (see :meth:`RelayMixin.claim`); ``{n}`` gives the table names, ``{locked}``
#: the locked lanes (a text[] in their order)
_CLAIM_SQL = (
    "WITH head AS MATERIALIZED (SELECT l.o, l.stream, d.id, d.attempts, d.first_attempt_at, d.event_seq "
    "  FROM unnest({locked}) WITH ORDINALITY AS l(stream, o) "
    "  CROSS JOIN LATERAL (SELECT id, attempts, first_attempt_at, event_seq FROM {n.deliveries} "
    "    WHERE destination = %(dest)s AND stream = l.stream ORDER BY id LIMIT %(per_lane)s) d "
    "  ORDER BY l.o, d.id LIMIT %(lim)s), "
    # the sizes below the window's sort, so that sort carries no event data
    "sized AS MATERIALIZED (SELECT x.*, row_number() OVER w AS rn, sum(x.size) OVER w AS run FROM "
    "  (SELECT h.*, e.ctid AS tid, octet_length(e.data) AS size "
    "   FROM head h JOIN {n.events} e ON e.seq = h.event_seq) x "
    "  WINDOW w AS (ORDER BY x.o, x.id)), "
    # running sums grow along the order, so this keeps a prefix of each lane; the first row always
    "picked AS MATERIALIZED (SELECT * FROM sized WHERE rn = 1 OR run <= %(budget)s), "
    "lease AS (UPDATE {n.lanes} SET owner = %(owner)s, due_at = %(until)s "
    "  WHERE destination = %(dest)s AND stream IN (SELECT stream FROM picked)), "
    # a locked lane whose deliveries are gone (counter drift) would be "due" forever
    "empty AS (DELETE FROM {n.lanes} l WHERE destination = %(dest)s "
    "  AND (SELECT count(*) FROM head) < %(lim)s AND stream = ANY({locked}) "
    "  AND NOT EXISTS (SELECT 1 FROM {n.deliveries} d WHERE d.destination = l.destination AND d.stream = l.stream)) "
    # the attributes and data by the row's address found above (a TID scan: no second descent of the
    # events' key; event rows are never updated, and this statement's snapshot sees the version it found),
    # joined to the picked rows in their order, so no sort carries them
    "SELECT p.id, p.attempts, p.first_attempt_at, p.event_seq, e.attrs, e.data "
    "FROM (SELECT * FROM picked ORDER BY rn) p "
    "CROSS JOIN LATERAL (SELECT attrs, data FROM {n.events} e WHERE e.ctid = p.tid) e ORDER BY p.rn"
)

#: settle's second statement (lanes ``{owned}`` are locked): delete the delivered/dead deliveries of
#: those lanes, release or drop the lanes, count the delivered; returns when the earliest lane kept
#: (with deliveries left, not parked) is due, or NULL
_SETTLE_SQL = (
    "WITH own AS MATERIALIZED (SELECT unnest({owned}) AS stream), "
    # by primary key, only rows of lanes in own (joined before the delete: never a scan of whole lanes)
    "del AS (DELETE FROM {n.deliveries} d USING (SELECT g.* FROM "
    "  unnest(%(gone)s::bigint[], %(ok)s::bool[], %(gone_streams)s::text[]) g(id, ok, stream) "
    "  JOIN own USING (stream)) g "
    "  WHERE d.id = g.id RETURNING d.stream, g.ok), "
    "cnt AS MATERIALIZED (SELECT stream, count(*) AS removed, count(*) FILTER (WHERE ok) AS ok FROM del "
    "  GROUP BY stream), "
    "lane AS MATERIALIZED (SELECT u.stream, u.due, u.parked, COALESCE(c.removed, 0) AS removed "
    "  FROM unnest(%(streams)s::text[], %(due)s::float8[], %(parked)s::bool[]) u(stream, due, parked) "
    "  JOIN own USING (stream) LEFT JOIN cnt c USING (stream)), "
    "upd AS (UPDATE {n.lanes} l SET pending = l.pending - lane.removed, owner = NULL, due_at = lane.due, "
    "  parked = lane.parked FROM lane WHERE l.destination = %(dest)s AND l.stream = lane.stream "
    "  AND l.pending - lane.removed > 0 RETURNING CASE WHEN lane.parked THEN NULL ELSE lane.due END AS due), "
    "emptied AS (DELETE FROM {n.lanes} l USING lane WHERE l.destination = %(dest)s AND l.stream = lane.stream "
    "  AND l.pending - lane.removed <= 0), "
    "tot AS (INSERT INTO {n.destinations} (destination, delivered) "
    "  SELECT %(dest)s, sum(ok) FROM cnt HAVING sum(ok) > 0 ON CONFLICT (destination) "
    "  DO UPDATE SET delivered = {n.destinations}.delivered + excluded.delivered) "
    "SELECT min(due) FROM upd"
)
