"""The embedded SQLite outbox (``sqlite:///path/to/outbox.db``).

One relay process per database (enforced by an advisory lock file next to
it); any number of application processes may append. WAL mode, a busy
timeout, and tables prefixed ``outrelay_`` so the outbox can live in the
application's own database file. Appends in the application's connection run
in its transaction; the relay's bookkeeping uses its own connection.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import orjson

from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError, StoreError, StoreLockedError
from outrelay.core.stores.base import Attempt, Claimed, InlineRefused, Settlement, Store, inline_call, running_inline
from outrelay.core.stores.lanes import SQLiteLanesMixin
from outrelay.core.stores.sqlite_attempts import SQLiteAttemptsMixin
from outrelay.core.stores.sqlite_audit import SQLiteAuditMixin
from outrelay.core.stores.sqlite_history import SQLiteHistoryMixin
from outrelay.core.stores.sqlite_ops import SQLiteOperatorMixin
from outrelay.core.stores.sqlite_schema import MIGRATIONS
from outrelay.core.stores.sqlite_watch import CommitWatcher, data_version

__all__ = ["SQLiteStore", "path_from_url"]

log = logging.getLogger("outrelay.relay")

#: seconds a statement waits for another writer's lock before failing
BUSY_TIMEOUT = 30.0


def path_from_url(url: str) -> str:
    """``sqlite:///rel.db`` → ``rel.db``; ``sqlite:////abs.db`` → ``/abs.db``;
    ``sqlite:///:memory:`` is refused (the relay needs a file it can share)."""
    if not url.startswith("sqlite:///"):
        raise StoreError(f"outbox url {url!r} is not sqlite:///PATH (e.g. sqlite:///outbox.db)")
    path = url[len("sqlite:///") :]
    if not path or path == ":memory:":
        raise StoreError("outbox url needs a file path, e.g. sqlite:///outbox.db")
    return path


def _busy(db: sqlite3.Connection, sql: str, args: Sequence[Any] = ()) -> sqlite3.Cursor:
    """``db.execute`` retried while the database is locked by another writer, up to
    :data:`BUSY_TIMEOUT` seconds (then the error stands).

    SQLite has no queue for its write lock: a waiter polls. The first
    :data:`_BUSY_EAGER` seconds it tries every 0.1 ms — an appender committing
    with an fsync holds the lock for a fraction of a millisecond at a time, and a
    relay that slept 0.5-5 ms between tries lost most of the gaps between its
    commits (at 1,000 appends/s on disk: commit -> broker p50 29 ms, p99 94 ms;
    retrying every 0.1 ms: p50 5 ms, p99 14-22 ms). A longer wait backs off to one
    try every 5 ms."""
    deadline = eager = 0.0
    delay = _BUSY_FIRST
    while True:
        try:
            return db.execute(sql, args)
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if running_inline():  # in the relay's loop (SQLiteStore.call_inline): never wait there
                raise InlineRefused(f"the database is locked ({sql.split()[0]})") from exc
            now = time.monotonic()
            if not deadline:
                deadline, eager = now + BUSY_TIMEOUT, now + _BUSY_EAGER
            if now >= deadline:
                raise
            time.sleep(delay)
            if now >= eager:
                delay = min(delay * 1.5, 0.005)


#: lanes a claim may take, given (destination, now, owner): whether there is one, and the first ``limit``
_DUE_LANE = "destination = ? AND parked = 0 AND due_at <= ? AND (owner IS NULL OR owner <> ?)"
_ANY_DUE_LANE = f"SELECT 1 FROM outrelay_lanes WHERE {_DUE_LANE} LIMIT 1"
_DUE_LANES = f"SELECT stream FROM outrelay_lanes WHERE {_DUE_LANE} ORDER BY due_at LIMIT ?"
#: when the next lane a claim by ``owner`` may take is due, given (destination, owner)
_NEXT_DUE_LANE = (
    "SELECT MIN(due_at) FROM outrelay_lanes WHERE destination = ? AND parked = 0 AND (owner IS NULL OR owner <> ?)"
)

_BUSY_FIRST = 0.0001  # seconds between tries of a locked database at first
_BUSY_EAGER = 0.01  # seconds of tries every _BUSY_FIRST before backing off
T = TypeVar("T")


class SQLiteStore(
    SQLiteHistoryMixin, SQLiteOperatorMixin, SQLiteLanesMixin, SQLiteAuditMixin, SQLiteAttemptsMixin, Store
):
    """See the module docstring. Thread-safe: one connection, one lock."""

    max_workers = 1
    multi_relay = False
    #: the relay's calls at every event; each is one transaction (or a read) whose only wait is the first
    #: statement's (see :meth:`call_inline`)
    inline_methods = frozenset({"route", "claim", "route_and_claim", "settle", "next_due"})

    def __init__(self, url: str, *, synchronous: str = "FULL") -> None:
        self.url = url
        self.path = path_from_url(url)
        parent = Path(self.path).parent
        if not parent.exists():
            raise StoreError(f"directory {str(parent)!r} for the outbox {self.path!r} does not exist; create it first")
        self._lock = threading.RLock()
        #: destination -> (no lane due before this time, as read then); see quiet_until
        self._quiet: dict[str, tuple[float, float]] = {}
        self._synchronous = synchronous
        self._lockfile: int | None = None
        self._own_watch: CommitWatcher | None = None
        try:
            # timeout=0: a busy database raises at once and _busy() retries every 0.1 ms at first; SQLite's own
            # busy handler sleeps 1, 2, 5, 10, 15, 20, 25... ms, which put 50-100 ms into the relay's p99
            self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=0.0)
            _busy(self._db, "PRAGMA journal_mode=WAL")
            self._db.execute(f"PRAGMA synchronous={synchronous}")
            self._sync_now = synchronous  # the connection's setting now (see _tx)
            self._db.execute("PRAGMA foreign_keys=ON")
            self._migrate()
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open SQLite outbox {self.path!r}: {exc}") from exc

    # -- plumbing -------------------------------------------------------------

    @contextmanager
    def _tx(self, mode: str = "IMMEDIATE", *, relaxed: bool = False) -> Iterator[sqlite3.Connection]:
        """One write transaction on the store's connection (inside another one: that one).

        ``relaxed`` commits without an fsync (``synchronous=NORMAL`` in WAL
        mode) — for the relay's bookkeeping only: a power cut can then roll
        back its last transactions as a whole (WAL keeps them atomic and in
        commit order, and any later fsynced commit makes them durable), which
        means sending some events again, never losing one. Appends and
        operator actions are never relaxed; such a transaction also forgets
        what :meth:`quiet_until` knew (it may have made lanes due).
        """
        with self._lock:
            db = self._db
            if db.in_transaction:  # called inside one of this store's transactions (route_and_claim): join it
                yield db
                return
            try:
                # set outside the transaction (SQLite ignores it inside), and only when it changes: the
                # relay's bookkeeping runs relaxed transaction after transaction
                wanted = "NORMAL" if relaxed else self._synchronous
                if self._sync_now != wanted:
                    self._sync_now = ""  # unknown until the PRAGMA ran
                    db.execute(f"PRAGMA synchronous={wanted}")
                    self._sync_now = wanted
                watch = self._own_watch if self._own_watch is not None and self._own_watch.owns_thread() else None
                try:
                    _busy(db, f"BEGIN {mode}")
                    if watch is not None:
                        watch.own_tx_begun()
                    yield db
                    if watch is not None:
                        before = data_version(db)
                    _busy(db, "COMMIT")
                    if watch is not None:
                        watch.own_tx_committed(before, db)
                    if not relaxed:
                        self._quiet.clear()
                except BaseException:
                    if db.in_transaction:
                        db.execute("ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite outbox {self.path!r}: {exc}") from exc

    def call_inline(self, call: Callable[[], T]) -> T:
        """See :meth:`Store.call_inline`: refused while another thread uses the connection, or when the
        database is locked by another writer (``_busy`` refuses instead of waiting; each of
        :attr:`inline_methods` meets it at its first statement, or rolls back: nothing was done)."""
        if not self._lock.acquire(blocking=False):
            raise InlineRefused("the store's connection is in use")
        try:
            with inline_call():
                return call()
        finally:
            self._lock.release()

    def _q(self, sql: str, args: Sequence[Any] = ()) -> list[Any]:
        with self._lock:
            try:
                return _busy(self._db, sql, args).fetchall()
            except sqlite3.Error as exc:
                raise StoreError(f"SQLite outbox {self.path!r}: {exc}") from exc

    def _migrate(self) -> None:
        with self._tx() as db:
            db.execute("CREATE TABLE IF NOT EXISTS outrelay_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            row = db.execute("SELECT value FROM outrelay_meta WHERE key='schema_version'").fetchone()
            version = int(row[0]) if row else 0
            if version > len(MIGRATIONS):
                raise StoreError(
                    f"outbox {self.path!r} has schema version {version}, newer than this outrelay "
                    f"({len(MIGRATIONS)}); upgrade outrelay"
                )
            for i, script in enumerate(MIGRATIONS[version:], start=version + 1):
                for stmt in script:
                    db.execute(stmt)
                db.execute("INSERT OR REPLACE INTO outrelay_meta VALUES ('schema_version', ?)", (str(i),))

    @staticmethod
    def _event(seq: int, attrs: bytes | str, data: bytes) -> Event:
        return Event.from_attributes(orjson.loads(attrs), data, seq)

    # -- application side -------------------------------------------------------

    def append(self, events: Sequence[Event], conn: Any = None) -> list[Event]:
        rows = [
            (e.id, e.stream, e.type, e.tenant, e.time.timestamp(), orjson.dumps(e.attributes()), e.data) for e in events
        ]
        sql = "INSERT INTO outrelay_events (id, stream, type, tenant, time, attrs, data) VALUES (?, ?, ?, ?, ?, ?, ?)"

        def insert(db: sqlite3.Connection) -> range:
            # one executemany inside one write transaction: SQLite has a single writer, so the
            # AUTOINCREMENT sequence numbers of this batch are contiguous and end at last_insert_rowid()
            db.executemany(sql, rows)
            last = int(db.execute("SELECT last_insert_rowid()").fetchone()[0])
            return range(last - len(rows) + 1, last + 1)

        try:
            if conn is not None:
                if not isinstance(conn, sqlite3.Connection):
                    raise StoreError(
                        f"append(conn=...) on a SQLite outbox takes a sqlite3.Connection, got {type(conn).__name__}"
                    )
                if conn.in_transaction or conn.isolation_level is not None:
                    seqs = insert(conn)  # the caller's transaction (sqlite3 opens one implicitly) — caller commits
                else:  # an autocommit connection outside a transaction: one of our own, on it
                    conn.execute("BEGIN IMMEDIATE")
                    try:
                        seqs = insert(conn)
                        conn.execute("COMMIT")
                    except BaseException:
                        conn.execute("ROLLBACK")
                        raise
            else:
                with self._tx() as db:
                    seqs = insert(db)
        except (sqlite3.IntegrityError, StoreError) as exc:
            cause = exc.__cause__ if isinstance(exc, StoreError) else exc
            if isinstance(cause, sqlite3.IntegrityError) and "outrelay_events.id" in str(cause):
                raise EventError(f"an event with one of these ids is already in the outbox: {cause}") from None
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"SQLite outbox {self.path!r}: {exc}") from exc
        except sqlite3.OperationalError as exc:
            if "no such table" in str(exc):
                raise StoreError(
                    "the connection passed to append() is not on the outbox database "
                    f"{self.path!r} (no outrelay tables)"
                ) from exc
            raise StoreError(f"SQLite outbox {self.path!r}: {exc}") from exc
        return [e.with_sequence(s) for e, s in zip(events, seqs, strict=True)]

    listens_in_loop = True

    def listen(
        self, callback: Callable[[str], None], *, loop: asyncio.AbstractEventLoop | None = None
    ) -> Callable[[], None]:
        """Call ``callback("appended")`` within milliseconds of another process committing an
        append (see :mod:`.sqlite_watch`): in ``loop`` (from its thread; call the returned stop
        function there too) where inotify is available, else from a thread; returns the stop function."""
        try:
            watcher = CommitWatcher(self.path, callback, loop)
        except (sqlite3.Error, OSError) as exc:  # polling still works: a degraded relay, not a dead one
            log.warning("SQLite outbox %r: no cross-process wake-ups (%s); polling only", self.path, exc)
            return lambda: None
        if watcher.in_loop:
            self._own_watch = watcher

        def stop() -> None:
            if self._own_watch is watcher:
                self._own_watch = None
            watcher.stop()

        return stop

    # -- relay side -------------------------------------------------------------

    def acquire_relay(self, owner: str) -> None:
        import fcntl

        lock_path = self.path + ".relay-lock"
        try:
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StoreError(f"cannot create the relay lock file {lock_path!r}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            other = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StoreLockedError(
                f"another relay (pid {other}) is running on the SQLite outbox {self.path!r}; "
                "SQLite serves one relay process — stop the other one, or use PostgreSQL for several"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, str(os.getpid()).encode(), 0)
        except OSError as exc:  # e.g. ENOSPC: one clear line, not a traceback
            os.close(fd)
            raise StoreError(
                f"cannot write the relay lock file {lock_path!r}: {exc.strerror}; free disk space or fix permissions"
            ) from None
        self._lockfile = fd
        with self._tx() as db:  # whatever a crashed predecessor leased is free again
            db.execute(
                "UPDATE outrelay_lanes SET owner = NULL, due_at = MIN(due_at, ?) WHERE owner IS NOT NULL", (0.0,)
            )

    def release_relay(self, owner: str) -> None:
        with self._tx(relaxed=True) as db:
            db.execute("UPDATE outrelay_lanes SET owner = NULL, due_at = 0 WHERE owner = ?", (owner,))
            self._quiet.clear()
        if self._lockfile is not None:
            os.close(self._lockfile)
            self._lockfile = None

    def route(self, router: Callable[[Event], Sequence[str]], limit: int, now: float) -> int:
        with self._lock:
            routed = self._route(router, limit, now)
            if routed:
                self._quiet.clear()  # lanes got deliveries: every destination claims again
            return routed

    def _route(self, router: Callable[[Event], Sequence[str]], limit: int, now: float) -> int:
        with self._tx(relaxed=True) as db:
            cursor = self._cursor(db)
            static = getattr(router, "static_destinations", None)
            if static is not None:
                return self._route_static(db, static, cursor, limit, now)
            # the envelope only: routes match on its fields, and reading the payloads of a routing
            # batch (2,000 x 1 MB) held them all in memory at once
            rows = db.execute(
                "SELECT seq, stream, attrs FROM outrelay_events WHERE seq > ? ORDER BY seq LIMIT ?",
                (cursor, limit),
            ).fetchall()
            if not rows:
                return 0
            deliveries: list[tuple[str, str, int, float]] = []
            lanes: dict[tuple[str, str], int] = {}
            for seq, stream, attrs in rows:
                for dest in router(self._event(seq, attrs, b"")):
                    deliveries.append((dest, stream, seq, now))
                    lanes[(dest, stream)] = lanes.get((dest, stream), 0) + 1
            if self.audit is not None:
                self._audit_routed(db, cursor, rows[-1][0], now)
            db.executemany(
                "INSERT INTO outrelay_deliveries (destination, stream, event_seq, created_at) VALUES (?, ?, ?, ?)",
                deliveries,
            )
            db.executemany(
                "INSERT INTO outrelay_lanes (destination, stream, due_at, pending) VALUES (?, ?, ?, ?) "
                "ON CONFLICT (destination, stream) DO UPDATE SET pending = pending + excluded.pending",
                [(d, s, now, n) for (d, s), n in lanes.items()],
            )
            self._set_cursor(db, rows[-1][0])
            return len(rows)

    def _route_static(self, db: sqlite3.Connection, dests: Sequence[str], cursor: int, limit: int, now: float) -> int:
        """Every event goes to every destination: route inside SQLite, no row reaches Python."""
        count, last = db.execute(
            "SELECT COUNT(*), MAX(seq) FROM (SELECT seq FROM outrelay_events WHERE seq > ? ORDER BY seq LIMIT ?)",
            (cursor, limit),
        ).fetchone()
        if not count:
            return 0
        for dest in dests:  # ids ascend with seq, so each lane keeps event order
            db.execute(
                "INSERT INTO outrelay_deliveries (destination, stream, event_seq, created_at) "
                "SELECT ?, stream, seq, ? FROM outrelay_events WHERE seq > ? AND seq <= ? ORDER BY seq",
                (dest, now, cursor, last),
            )
            db.execute(
                "INSERT INTO outrelay_lanes (destination, stream, due_at, pending) "
                "SELECT ?, stream, ?, COUNT(*) FROM outrelay_events WHERE seq > ? AND seq <= ? GROUP BY stream "
                "ON CONFLICT (destination, stream) DO UPDATE SET pending = pending + excluded.pending",
                (dest, now, cursor, last),
            )
        if self.audit is not None:
            self._audit_routed(db, cursor, int(last), now)
        self._set_cursor(db, int(last))
        return int(count)

    def route_and_claim(
        self, router: Callable[[Event], Sequence[str]], route_limit: int, destination: str, **claim: Any
    ) -> tuple[int, list[Claimed]]:
        """:meth:`route` then :meth:`claim` in one transaction: what a relay does when an append
        wakes a destination — one hand-off to the store's thread and one commit instead of two,
        and no wake-up of the router in between. Returns (routed, claimed). A failure rolls both
        back: nothing is routed or claimed.

        :raises StoreError: as :meth:`route` and :meth:`claim`."""
        with self._tx(relaxed=True):
            routed = self.route(router, route_limit, claim["now"])
            return routed, self.claim(destination, **claim)

    def quiet_until(self, destination: str, ttl: float) -> float:
        """See :meth:`Store.quiet_until`: known from this relay's last claim of ``destination``
        that was not full (the earliest ``due_at`` of the lanes it did not hold then), lowered by
        its settles that kept lanes pending, forgotten when it routes or releases its lanes and
        by every transaction that is not the relay's bookkeeping (appends, operator actions in
        this process); trusted for ``ttl`` seconds at most (other processes' operator actions
        are not announced)."""
        known = self._quiet.get(destination)
        return 0.0 if known is None else min(known[0], known[1] + ttl)

    def _know_quiet(self, db: sqlite3.Connection, destination: str, owner: str, now: float) -> None:
        """Remember when the next lane of ``destination`` that ``owner`` does not hold is due
        (under the store's lock, in or right after the claim that read the lanes)."""
        row = db.execute(_NEXT_DUE_LANE, (destination, owner)).fetchone()
        self._quiet[destination] = (float("inf") if row[0] is None else float(row[0]), now)

    def _lower_quiet(self, destination: str, due: float) -> None:
        """A lane of ``destination`` is due at ``due`` (a settle kept it pending)."""
        known = self._quiet.get(destination)
        if known is not None and due < known[0]:
            self._quiet[destination] = (due, known[1])

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
        """See :meth:`Store.claim`. A claim that is not full also reads when the next lane it
        did not take is due, for :meth:`quiet_until` (the relay then waits without asking)."""
        with self._lock:
            budget = max_bytes if max_bytes is not None else float("inf")
            # Nothing due (a relay between batches, a trickle of appends): a read says so without the write
            # transaction below, whose lock an appender's fsync holds for a millisecond at a time. A lane due a
            # moment after this read is claimed by the next claim, as if this one had run a moment earlier.
            # Inside route_and_claim's write transaction the read would save nothing.
            if not self._db.in_transaction and not self._q(_ANY_DUE_LANE, (destination, now, owner)):
                try:
                    self._know_quiet(self._db, destination, owner, now)
                except sqlite3.Error as exc:
                    raise StoreError(f"SQLite outbox {self.path!r}: {exc}") from exc
                return []
            with self._tx(relaxed=True) as db:
                streams = [r[0] for r in db.execute(_DUE_LANES, (destination, now, owner, limit))]
                picked, leased = self._pick(db, destination, streams, per_lane, limit, budget)
                db.executemany(
                    "UPDATE outrelay_lanes SET owner = ?, due_at = ? WHERE destination = ? AND stream = ?",
                    [(owner, now + lease_seconds, destination, s) for s in leased],
                )
                data = self._data(db, [p[3] for p in picked])
                if len(picked) < limit:
                    self._know_quiet(db, destination, owner, now)
                else:
                    self._quiet.pop(destination, None)  # full: the next claim asks the database
            decode, loads = Event.from_attributes, orjson.loads
            claimed = [
                Claimed(d_id, decode(loads(attrs), data[seq], seq), attempts, first)
                for d_id, attempts, first, seq, attrs in picked
            ]
            if self.audit is not None:  # settling then describes the batch without reading it again
                self.audit.remember(claimed)
            return claimed

    @staticmethod
    def _pick(
        db: sqlite3.Connection, destination: str, streams: list[str], per_lane: int, limit: int, budget: float
    ) -> tuple[list[tuple[int, int, float | None, int, bytes]], list[str]]:
        """The deliveries a claim takes from the due lanes ``streams`` (in order): up to ``per_lane``
        of each lane's first, ``limit`` in all, a prefix of each lane within ``budget`` bytes (at
        least one delivery). Returns them (id, attempts, first attempt, seq, envelope) and the
        lanes they came from; an empty lane found on the way is deleted."""
        picked: list[tuple[int, int, float | None, int, bytes]] = []  # id, attempts, first, seq, attrs
        leased: list[str] = []
        size = 0
        for stream in streams:
            room = min(per_lane, limit - len(picked))
            if room <= 0 or size >= budget:
                break
            # length(data) reads the blob's header only: sizes decide before any data is loaded
            rows = db.execute(
                "SELECT d.id, d.attempts, d.first_attempt_at, e.seq, e.attrs, length(e.data) "
                "FROM outrelay_deliveries d JOIN outrelay_events e ON e.seq = d.event_seq "
                "WHERE d.destination = ? AND d.stream = ? ORDER BY d.id LIMIT ?",
                (destination, stream, room),
            ).fetchall()
            if not rows:  # an empty lane must not occupy the head of the queue
                db.execute("DELETE FROM outrelay_lanes WHERE destination = ? AND stream = ?", (destination, stream))
                continue
            taken = 0
            for row in rows:
                if picked and size + row[5] > budget:
                    break  # a lane prefix only: later rows of this lane wait too
                picked.append(row[:5])
                size += row[5]
                taken += 1
            if taken:
                leased.append(stream)
        return picked, leased

    @staticmethod
    def _data(db: sqlite3.Connection, seqs: list[int]) -> dict[int, bytes]:
        out: dict[int, bytes] = {}
        for lo in range(0, len(seqs), 500):  # under SQLite's bound-variable limit
            chunk = seqs[lo : lo + 500]
            marks = ",".join("?" * len(chunk))
            out.update(db.execute(f"SELECT seq, data FROM outrelay_events WHERE seq IN ({marks})", chunk).fetchall())
        return out

    def renew_leases(self, owner: str, lease_seconds: float, now: float) -> int:
        with self._tx(relaxed=True) as db:
            return db.execute(
                "UPDATE outrelay_lanes SET due_at = ? WHERE owner = ?", (now + lease_seconds, owner)
            ).rowcount

    def settle(
        self,
        destination: str,
        owner: str,
        settlements: Sequence[Settlement],
        now: float,
        attempts: Sequence[Attempt] = (),
    ) -> None:
        lanes: dict[str, tuple[float, bool, int]] = {}  # stream -> (due_at, parked, removed)
        done: dict[str, list[tuple[int]]] = {}  # stream -> delivered ids
        undelivered: set[str] = set()  # streams with a settlement other than delivered so far
        scattered: set[str] = set()  # streams with a delivered row after an undelivered one
        with self._tx(relaxed=True) as db:
            if self.audit is not None:  # in this transaction, before the deliveries go
                self._audit_settled(db, destination, settlements, now)
            if attempts:  # the delivery-attempt log, in this transaction
                self._log_attempts(db, destination, attempts)
            for s in settlements:
                due, parked, removed = lanes.get(s.stream, (now, False, 0))
                if s.kind == "delivered":
                    if s.stream in undelivered:
                        scattered.add(s.stream)
                    done.setdefault(s.stream, []).append((s.delivery_id,))
                else:
                    undelivered.add(s.stream)
                if s.kind == "retry":
                    db.execute(
                        "UPDATE outrelay_deliveries SET attempts = ?, last_error = ?, "
                        "first_attempt_at = COALESCE(first_attempt_at, ?) WHERE id = ?",
                        (s.attempts, s.error, now, s.delivery_id),
                    )
                    due = max(due, s.due_at)
                elif s.kind in ("dead", "park"):
                    gone = self._dead_letter(db, destination, s, now)
                    if gone is None:
                        continue
                    removed += gone
                    parked = parked or s.kind == "park"
                lanes[s.stream] = (due, parked, removed)
            self._delete_delivered(db, destination, done, scattered, lanes)
            self._release_lanes(db, destination, owner, lanes)

    @staticmethod
    def _dead_letter(db: sqlite3.Connection, destination: str, s: Settlement, now: float) -> int | None:
        """Dead-letter (``dead``: the delivery goes) or park (``park``: it stays, its lane stops) one
        delivery. Returns the deliveries removed, or None when the delivery is gone already."""
        row = db.execute(
            "SELECT event_seq, first_attempt_at FROM outrelay_deliveries WHERE id = ?", (s.delivery_id,)
        ).fetchone()
        if row is None:
            return None
        db.execute(
            "INSERT INTO outrelay_dead_letters (event_seq, destination, stream, reason, attempts, "
            "first_attempt_at, failed_at, state, delivery_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                row[0],
                destination,
                s.stream,
                s.error or "",
                s.attempts,
                row[1] or now,
                now,
                "dead" if s.kind == "dead" else "parked",
                s.delivery_id if s.kind == "park" else None,
            ),
        )
        if s.kind == "dead":
            return int(db.execute("DELETE FROM outrelay_deliveries WHERE id = ?", (s.delivery_id,)).rowcount)
        db.execute(
            "UPDATE outrelay_deliveries SET attempts = ?, last_error = ? WHERE id = ?",
            (s.attempts, s.error, s.delivery_id),
        )
        return 0

    @staticmethod
    def _delete_delivered(
        db: sqlite3.Connection,
        destination: str,
        done: dict[str, list[tuple[int]]],
        scattered: set[str],
        lanes: dict[str, tuple[float, bool, int]],
    ) -> int:
        """Delete the delivered rows (``done``, per stream), count them into ``lanes``' removed and
        add them to the destination's delivered counter; returns how many went."""
        delivered = 0
        for stream, ids in done.items():
            # rowcount, not len(ids): a relay whose lease ran out may settle rows another already removed
            if stream not in scattered:
                # delivered rows are the first of their lane (a claim takes a lane's lowest ids,
                # settlements keep claim order, ids only grow): one range delete
                gone = db.execute(
                    "DELETE FROM outrelay_deliveries WHERE destination = ? AND stream = ? AND id <= ?",
                    (destination, stream, ids[-1][0]),
                ).rowcount
            else:
                gone = db.executemany("DELETE FROM outrelay_deliveries WHERE id = ?", ids).rowcount
            due, parked, removed = lanes[stream]
            lanes[stream] = (due, parked, removed + gone)
            delivered += gone
        if delivered:
            db.execute(
                "INSERT INTO outrelay_destinations (destination, delivered) VALUES (?, ?) "
                "ON CONFLICT (destination) DO UPDATE SET delivered = delivered + excluded.delivered",
                (destination, delivered),
            )
        return delivered

    def _release_lanes(
        self, db: sqlite3.Connection, destination: str, owner: str, lanes: dict[str, tuple[float, bool, int]]
    ) -> None:
        """Release the settled lanes: lower their pending counts, due again at their ``due_at``
        (parked ones stop), deleted when empty."""
        for stream, (due, parked, removed) in lanes.items():
            # a lane this settle empties goes, whoever holds it (a relay whose lease ran out may settle
            # after another took the lane): one statement at a trickle; else its count drops, and it is
            # released (due again at `due`, or parked) if it is still ``owner``'s: one more
            emptied = db.execute(
                "DELETE FROM outrelay_lanes WHERE destination = ? AND stream = ? AND pending <= ?",
                (destination, stream, removed),
            ).rowcount
            if not emptied:
                db.execute(
                    "UPDATE outrelay_lanes SET pending = pending - ?, "
                    "due_at = CASE WHEN owner = ? THEN ? ELSE due_at END, "
                    "parked = CASE WHEN owner = ? THEN ? ELSE parked END, "
                    "owner = CASE WHEN owner = ? THEN NULL ELSE owner END "
                    "WHERE destination = ? AND stream = ?",
                    (removed, owner, due, owner, int(parked), owner, destination, stream),
                )
            if not emptied and not parked:  # the lane keeps deliveries: due again at `due`
                self._lower_quiet(destination, due)

    def next_due(self, destination: str) -> float | None:
        row = self._q("SELECT MIN(due_at) FROM outrelay_lanes WHERE destination = ? AND parked = 0", (destination,))
        return None if row[0][0] is None else float(row[0][0])

    def unrouted(self) -> int:
        with self._lock:
            return int(self._q("SELECT COUNT(*) FROM outrelay_events WHERE seq > ?", (self._cursor(self._db),))[0][0])

    @staticmethod
    def _set_cursor(db: sqlite3.Connection, seq: int) -> None:
        db.execute("UPDATE outrelay_meta SET value = ? WHERE key = 'route_cursor'", (str(seq),))

    @staticmethod
    def _cursor(db: sqlite3.Connection) -> int:
        """Sequence of the last routed event (see migration 2)."""
        return int(db.execute("SELECT value FROM outrelay_meta WHERE key = 'route_cursor'").fetchone()[0])

    def close(self) -> None:
        with self._lock:
            if self._lockfile is not None:
                os.close(self._lockfile)
                self._lockfile = None
            self._db.close()

    def __repr__(self) -> str:
        return f"<SQLiteStore {self.path!r}>"
