"""A small cross-process reference transport for the consumer-side checks' own tests: ``sqlbus``.

Messages go to a SQLite file (WAL), so members in other processes consume
them, and its :class:`SqlSubscription` keeps the whole contract of
:mod:`outrelay.core.contract.subscription` in one place:

* **group** — the group's position is a row; messages past it are moved into
  ``pending`` (free, ``member`` NULL) and handed, in sequence order, to a
  member unless an earlier one of the same stream is with another member (one
  member per stream at a time). A member stamps ``members.alive`` at every
  ``receive``; one silent for ``claim_timeout`` is dead and its pending rows
  become free again, as do a stopped member's. ``ack`` deletes the row.
* **fan-out** — a private position, at the target's end at ``start``.

Every transaction is ``BEGIN IMMEDIATE`` (one writer at a time across
processes) and runs in a worker thread. Each subclass in
``test_broken_subscription.py`` breaks one rule by overriding one method.
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections.abc import Sequence
from typing import Any

import orjson

from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec
from outrelay.core.contract.transport import Capabilities, Delivered, Message, Received, SendResult, TransportConfig
from outrelay.core.model import cloudevents
from outrelay.kit import LifecycleTransport

SCHEMA = """
CREATE TABLE IF NOT EXISTS msgs (seq INTEGER PRIMARY KEY AUTOINCREMENT, target TEXT, stream TEXT, headers TEXT,
                                 body BLOB);
CREATE TABLE IF NOT EXISTS groups (target TEXT, grp TEXT, position INTEGER, PRIMARY KEY (target, grp));
CREATE TABLE IF NOT EXISTS pending (target TEXT, grp TEXT, seq INTEGER, stream TEXT, member TEXT,
                                    PRIMARY KEY (target, grp, seq));
CREATE TABLE IF NOT EXISTS members (target TEXT, grp TEXT, member TEXT, alive REAL, PRIMARY KEY (target, grp, member));
"""


def connect(path: str) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=30, isolation_level=None, check_same_thread=False)
    db.execute("PRAGMA journal_mode=WAL")
    db.executescript(SCHEMA)
    return db


def put_foreign(path: str, target: str, body: bytes = b"not a cloudevent") -> None:
    """Store a message without CloudEvents headers (the foreign-message hook)."""
    db = connect(path)
    try:
        db.execute("INSERT INTO msgs (target, stream, headers, body) VALUES (?, '', '{}', ?)", (target, body))
    finally:
        db.close()


class SqlBusConfig(TransportConfig):
    path: str
    target: str = "events"


class SqlBusTransport(LifecycleTransport):
    """Publishes to a SQLite file; subscriptions through :attr:`Subscription` (a class, so subclasses swap it)."""

    name = "sqlbus"
    Config = SqlBusConfig

    def __init__(self, config: SqlBusConfig, *, destination: str = "sqlbus") -> None:
        super().__init__(config, destination=destination)
        self.cfg = config
        self._db: sqlite3.Connection | None = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(ordering_by_key=True, ordered_batches=True, subscriptions=True)

    def target(self, event: Any) -> str:
        return self.cfg.target

    async def _open(self) -> None:
        self._db = await asyncio.to_thread(connect, self.cfg.path)
        self._write_lock = threading.Lock()

    async def _close(self) -> None:
        db, self._db = self._db, None
        if db is None:
            return
        lock = self._write_lock

        def close() -> None:  # not while a cancelled send's insert still runs in its thread
            with lock:
                db.close()

        await asyncio.to_thread(close)

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        assert self._db is not None
        rows = [(m.target, m.event.stream, orjson.dumps(cloudevents.binary_headers(m.event, content_type=True)),
                 m.event.data) for m in batch]  # fmt: skip
        db, lock = self._db, self._write_lock

        def insert() -> None:  # a commit may wait on the disk: never on the event loop (the loop watch)
            with lock:
                db.executemany("INSERT INTO msgs (target, stream, headers, body) VALUES (?, ?, ?, ?)", rows)

        await asyncio.to_thread(insert)
        return [Delivered() for _ in batch]

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        return self.Subscription(self.cfg.path, spec)

    Subscription: type[SqlSubscription]


class SqlSubscription(SubscriptionBackend):
    """See the module docstring."""

    def __init__(self, path: str, spec: SubscriptionSpec) -> None:
        super().__init__(spec)
        self.path = path
        self.db: sqlite3.Connection | None = None
        self.position = 0
        self.lock = threading.Lock()
        self.stopped = False

    async def _txn(self, fn: Any, *args: Any) -> Any:
        """``fn(db, *args)`` in one transaction in a worker thread; None once stopped (the
        connection is closed under the same lock, never while a transaction uses it)."""

        def run() -> Any:
            with self.lock:
                db = self.db
                if db is None:
                    return None
                db.execute("BEGIN IMMEDIATE")
                try:
                    out = fn(db, *args)
                except BaseException:
                    db.execute("ROLLBACK")
                    raise
                db.execute("COMMIT")
                return out

        return await asyncio.to_thread(run)

    async def start(self) -> None:
        self.db = await asyncio.to_thread(connect, self.path)
        await self._txn(self._join)

    def _join(self, db: sqlite3.Connection) -> None:
        s = self.spec
        end = db.execute("SELECT COALESCE(MAX(seq), 0) FROM msgs WHERE target = ?", (s.target,)).fetchone()[0]
        if s.group is None:
            self.position = 0 if s.from_beginning else end
            return
        start = self.new_group_position(end)
        db.execute("INSERT OR IGNORE INTO groups VALUES (?, ?, ?)", (s.target, s.group, start))
        db.execute("INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?)", (s.target, s.group, s.member, time.time()))

    def new_group_position(self, end: int) -> int:
        return 0 if self.spec.from_beginning else end

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        deadline = time.monotonic() + timeout
        while not self.stopped:
            take = self._take_group if self.spec.group is not None else self._take_fanout
            rows = await self._txn(take, max_messages) or []
            if rows or time.monotonic() >= deadline:
                return [self.inbound(*row) for row in rows]
            await asyncio.sleep(0.02)
        return []

    def _take_fanout(self, db: sqlite3.Connection, limit: int) -> list[tuple[Any, ...]]:
        rows = db.execute(
            "SELECT seq, stream, headers, body FROM msgs WHERE target = ? AND seq > ? ORDER BY seq LIMIT ?",
            (self.spec.target, self.position, limit),
        ).fetchall()
        if rows:
            self.position = rows[-1][0]
        return rows

    def _take_group(self, db: sqlite3.Connection, limit: int) -> list[tuple[Any, ...]]:
        s = self.spec
        key = (s.target, s.group)
        now = time.time()
        db.execute("INSERT OR REPLACE INTO members VALUES (?, ?, ?, ?)", (*key, s.member, now))
        self.reclaim(db, now)
        (position,) = db.execute("SELECT position FROM groups WHERE target = ? AND grp = ?", key).fetchone()
        db.execute(
            "INSERT INTO pending SELECT target, ?, seq, stream, NULL FROM msgs WHERE target = ? AND seq > ?",
            (s.group, s.target, position),
        )
        db.execute(
            "UPDATE groups SET position = (SELECT COALESCE(MAX(seq), position) FROM msgs WHERE target = ?) "
            "WHERE target = ? AND grp = ?",
            (s.target, *key),
        )
        (mine,) = db.execute("SELECT COUNT(*) FROM pending WHERE target = ? AND grp = ? AND member = ?",
                             (*key, s.member)).fetchone()  # fmt: skip
        room = min(limit, s.prefetch - mine)
        rows = db.execute("SELECT seq, stream, member FROM pending WHERE target = ? AND grp = ? ORDER BY seq",
                          key).fetchall()  # fmt: skip
        chosen = self.choose(rows, room)
        for seq in chosen:
            db.execute("UPDATE pending SET member = ? WHERE target = ? AND grp = ? AND seq = ?", (s.member, *key, seq))
        if not chosen:
            return []
        marks = ",".join("?" * len(chosen))
        return db.execute(f"SELECT seq, stream, headers, body FROM msgs WHERE seq IN ({marks}) ORDER BY seq",
                          chosen).fetchall()  # fmt: skip

    def reclaim(self, db: sqlite3.Connection, now: float) -> None:
        """Free the pending rows of members silent for claim_timeout, and forget those members."""
        s = self.spec
        dead = now - s.claim_timeout
        db.execute(
            "UPDATE pending SET member = NULL WHERE target = ? AND grp = ? AND member IN "
            "(SELECT member FROM members WHERE target = ? AND grp = ? AND alive < ?)",
            (s.target, s.group, s.target, s.group, dead),
        )
        db.execute("DELETE FROM members WHERE target = ? AND grp = ? AND alive < ?", (s.target, s.group, dead))

    def choose(self, rows: list[tuple[int, str, str | None]], room: int) -> list[int]:
        """The free rows to hand to this member, in order: a stream held by another member is skipped."""
        blocked = {stream for _, stream, member in rows if member is not None and member != self.spec.member}
        out: list[int] = []
        for seq, stream, member in rows:
            if len(out) >= room:
                break
            if member is None and stream not in blocked:
                out.append(seq)
            elif member is None:
                blocked.add(stream)
        return out

    def inbound(self, seq: int, stream: str, headers: str, body: bytes) -> Inbound:
        ack = self._acker(seq) if self.spec.group is not None else _no_ack
        try:
            hdrs = orjson.loads(headers)
            event = cloudevents.from_binary(hdrs, body, content_type=None)
        except Exception as exc:
            return Inbound(
                None, stream, ack, error=f"row {seq} is not an outrelay CloudEvent: {exc}", broker_id=str(seq)
            )
        return Inbound(Received(event, self.spec.target, stream, hdrs, body, event.content_type), stream, ack,
                       broker_id=str(seq))  # fmt: skip

    def _acker(self, seq: int) -> Any:
        async def ack() -> None:
            if not self.stopped:
                await self._txn(self.delete, seq)

        return ack

    def delete(self, db: sqlite3.Connection, seq: int) -> None:
        s = self.spec
        db.execute("DELETE FROM pending WHERE target = ? AND grp = ? AND seq = ? AND member = ?",
                   (s.target, s.group, seq, s.member))  # fmt: skip

    async def stop(self) -> None:
        if self.stopped or self.db is None:
            self.stopped = True
            return
        self.stopped = True
        if self.spec.group is not None:
            await self._txn(self.release)

        def close() -> None:
            with self.lock:
                db, self.db = self.db, None
                if db is not None:
                    db.close()

        await asyncio.to_thread(close)

    def release(self, db: sqlite3.Connection) -> None:
        """Free this member's pending rows and leave the group."""
        s = self.spec
        db.execute("UPDATE pending SET member = NULL WHERE target = ? AND grp = ? AND member = ?",
                   (s.target, s.group, s.member))  # fmt: skip
        db.execute("DELETE FROM members WHERE target = ? AND grp = ? AND member = ?", (s.target, s.group, s.member))


SqlBusTransport.Subscription = SqlSubscription


async def _no_ack() -> None:
    pass
