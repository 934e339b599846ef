"""PostgreSQL outbox specifics: appends in the application's transaction
(psycopg sync/async, SQLAlchemy sync/async), rollback, late commits,
NOTIFY wake-ups, schema/prefix options and migrations."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from outrelay import Event, Outbox
from outrelay.core.model.errors import ConfigError, EventError, StoreError
from outrelay.core.stores.base import Settlement
from outrelay.core.stores.postgres import PostgresStore
from outrelay.core.stores.postgres_schema import MIGRATIONS, Names, _bootstrap
from tests.stores.conftest import pg_admin_url, pg_url

T0 = 1_000_000.0


def ev(stream: str = "s", n: int = 0) -> Event:
    return Event(type="order.created", stream=stream, data={"n": n})


def migrate_to(conn: psycopg.Connection[Any], names: Names, version: int) -> None:
    """Bring the outbox ``names`` to schema ``version`` the way that version's outrelay left it."""
    for stmt in _bootstrap(names):
        conn.execute(stmt)
    for v, (name, stmts) in enumerate(MIGRATIONS[:version], start=1):
        for stmt in stmts:
            conn.execute(names.fill(stmt))
        conn.execute(f"INSERT INTO {names.migrations} (version, name) VALUES (%s, %s)", (v, name))


@pytest.fixture
def outbox(pg_schema: str) -> Iterator[Outbox]:
    ob = Outbox.open(pg_url(pg_schema))
    yield ob
    ob.close()


@pytest.fixture
def app_conn() -> Iterator[psycopg.Connection]:
    with psycopg.connect(pg_admin_url()) as conn:
        yield conn


def drain_ids(store: PostgresStore, dest: str = "d") -> list[str]:
    """Route everything, claim, deliver; return the event ids in claim order."""
    out: list[str] = []
    store.route(lambda e: [dest], 10_000, T0)

    while got := store.claim(dest, limit=100, per_lane=100, owner="t", lease_seconds=30, now=T0):
        out += [c.event.id for c in got]
        store.settle(dest, "t", [Settlement(c.delivery_id, c.event.stream, "delivered") for c in got], T0)
    return out


class TestAppendInTransaction:
    def test_psycopg_commit_and_rollback(self, outbox: Outbox, app_conn: psycopg.Connection) -> None:
        """Events appended in a psycopg transaction exist after commit and never after rollback."""
        kept, lost = ev("a"), ev("b")
        with app_conn.transaction():
            outbox.append(kept, conn=app_conn)
        try:
            with app_conn.transaction():
                outbox.append(lost, conn=app_conn)
                raise RuntimeError("application failure")
        except RuntimeError:
            pass
        assert drain_ids(outbox.store) == [kept.id]  # type: ignore[arg-type]

    def test_uncommitted_event_is_invisible_to_the_relay(self, outbox: Outbox, app_conn: psycopg.Connection) -> None:
        """An append in an open transaction is neither routed nor delivered before commit."""
        e = ev()
        outbox.append(e, conn=app_conn)  # psycopg opened a transaction implicitly
        assert drain_ids(outbox.store) == []  # type: ignore[arg-type]
        app_conn.commit()
        assert drain_ids(outbox.store) == [e.id]  # type: ignore[arg-type]

    def test_application_row_factory_is_respected(self, outbox: Outbox) -> None:
        """A connection with a dict row factory works and keeps its row factory."""
        from psycopg.rows import dict_row

        with psycopg.connect(pg_admin_url(), row_factory=dict_row) as conn:
            e = ev()
            assert outbox.append(e, conn=conn) == [e.id]
            conn.commit()
            assert conn.execute("SELECT 1 AS one").fetchone() == {"one": 1}
        assert drain_ids(outbox.store) == [e.id]  # type: ignore[arg-type]

    def test_duplicate_id_in_caller_transaction(self, outbox: Outbox, app_conn: psycopg.Connection) -> None:
        """A duplicate id raises EventError inside the caller's transaction."""
        e = ev()
        outbox.append(e)
        with pytest.raises(EventError):
            outbox.append(e, conn=app_conn)
        app_conn.rollback()

    async def test_async_psycopg(self, outbox: Outbox) -> None:
        """aappend joins an async psycopg transaction: committed kept, rolled back lost."""
        kept, lost = ev("a"), ev("b")
        async with await psycopg.AsyncConnection.connect(pg_admin_url()) as conn:
            async with conn.transaction():
                assert await outbox.aappend(kept, conn=conn) == [kept.id]
            await outbox.aappend(lost, conn=conn)
            await conn.rollback()
        assert drain_ids(outbox.store) == [kept.id]  # type: ignore[arg-type]

    async def test_aappend_without_connection(self, outbox: Outbox) -> None:
        """aappend without a connection commits on its own."""
        e = ev()
        assert await outbox.aappend([e]) == [e.id]
        assert drain_ids(outbox.store) == [e.id]  # type: ignore[arg-type]

    def test_sqlalchemy_session(self, outbox: Outbox) -> None:
        """Appends join a SQLAlchemy Session's transaction (commit kept, rollback lost)."""
        sqlalchemy = pytest.importorskip("sqlalchemy")
        from sqlalchemy.orm import Session

        engine = sqlalchemy.create_engine(pg_admin_url().replace("postgresql://", "postgresql+psycopg://"))
        kept, lost = ev("a"), ev("b")
        try:
            with Session(engine) as session:
                session.execute(sqlalchemy.text("SELECT 1"))
                outbox.append(kept, conn=session)
                session.commit()
                outbox.append(lost, conn=session)
                session.rollback()
            with engine.begin() as connection:
                outbox.append(ev("c"), conn=connection)
        finally:
            engine.dispose()
        assert drain_ids(outbox.store)[:1] == [kept.id]  # type: ignore[arg-type]
        assert lost.id not in [e.id for e in outbox.store.events()]

    async def test_sqlalchemy_async_session(self, outbox: Outbox) -> None:
        """aappend joins a SQLAlchemy AsyncSession's transaction."""
        pytest.importorskip("greenlet")
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        engine = create_async_engine(pg_admin_url().replace("postgresql://", "postgresql+psycopg://"))
        kept, lost = ev("a"), ev("b")
        try:
            async with AsyncSession(engine) as session:
                await outbox.aappend(kept, conn=session)
                await session.commit()
                await outbox.aappend(lost, conn=session)
                await session.rollback()
        finally:
            await engine.dispose()
        assert drain_ids(outbox.store) == [kept.id]  # type: ignore[arg-type]

    def test_wrong_connection_type(self, outbox: Outbox) -> None:
        """A connection the store cannot use is a StoreError naming what it takes."""
        with pytest.raises(StoreError, match=r"psycopg\.Connection"):
            outbox.append(ev(), conn=object())


class TestLateCommit:
    def test_lower_sequence_committed_late_is_delivered(self, outbox: Outbox) -> None:
        """A transaction holding a lower seq that commits after a higher one is still delivered."""
        store = outbox.store
        a_conn = psycopg.connect(pg_admin_url())
        try:
            a = ev("s", 1)
            outbox.append(a, conn=a_conn)  # takes the lower seq, stays open
            b = ev("s", 2)
            outbox.append(b)  # commits first
            assert drain_ids(store) == [b.id]  # type: ignore[arg-type]
            a_conn.commit()
            assert drain_ids(store) == [a.id]  # type: ignore[arg-type]
            seqs = {e.id: e.sequence for e in store.events()}
            assert (seqs[a.id] or 0) < (seqs[b.id] or 0)
        finally:
            a_conn.close()


class TestNotify:
    def test_listen_wakes_on_commit_only(self, outbox: Outbox, app_conn: psycopg.Connection) -> None:
        """listen() reports an append when it commits, never for an open or rolled-back one."""
        seen: list[str] = []
        got = threading.Event()

        def cb(what: str) -> None:
            seen.append(what)
            got.set()

        stop = outbox.store.listen(cb)
        try:
            time.sleep(0.3)  # let LISTEN start
            outbox.append(ev(), conn=app_conn)
            assert not got.wait(0.5)
            app_conn.rollback()
            assert not got.wait(0.5)
            outbox.append(ev(), conn=app_conn)
            app_conn.commit()
            assert got.wait(5)
            assert seen == ["appended"]
            got.clear()
            outbox.store.route(lambda e: ["d"], 100, T0)
            assert got.wait(5) and seen[-1] == "routed"
        finally:
            stop()

    def test_stop_does_not_wait_out_the_poll(self, outbox: Outbox, monkeypatch: pytest.MonkeyPatch) -> None:
        """Stopping a listener ends its thread even while it waits a long poll (the socket is shut
        down under it), with no warning logged; a second stop is harmless."""
        from outrelay.core.stores import postgres_pool

        monkeypatch.setattr(postgres_pool, "_POLL", 120.0)
        got = threading.Event()
        stop = outbox.store.listen(lambda what: got.set())
        deadline = time.monotonic() + 10
        while not got.is_set() and time.monotonic() < deadline:  # an append before LISTEN is not seen
            outbox.append(ev())
            got.wait(0.2)
        assert got.is_set()  # LISTEN is in place: the thread now waits out its poll
        threads = [t for t in threading.enumerate() if t.name == "outrelay-pg-listen"]
        stop()
        assert not any(t.is_alive() for t in threads)
        stop()

    async def test_listen_in_the_loop_hears_reconnects_and_stops(self, outbox: Outbox) -> None:
        """With ``loop``, notifications are read by the event loop and the callback runs in its thread;
        a LISTEN connection the server drops is made again; stop closes it at once."""
        loop = asyncio.get_running_loop()
        heard: list[tuple[str, int]] = []
        got = asyncio.Event()

        def cb(what: str) -> None:
            heard.append((what, threading.get_ident()))
            got.set()

        async def until_heard() -> None:
            deadline = time.monotonic() + 10
            while not got.is_set() and time.monotonic() < deadline:  # an append before LISTEN is not seen
                await asyncio.to_thread(outbox.append, ev())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(got.wait(), 0.2)
            assert got.is_set()

        def listeners() -> list[int]:
            with psycopg.connect(pg_admin_url(), autocommit=True) as admin:
                rows = admin.execute(
                    "SELECT pid FROM pg_stat_activity WHERE query LIKE 'LISTEN %%' AND pid <> pg_backend_pid()"
                ).fetchall()
            return [r[0] for r in rows]

        before = set(listeners())
        stop = outbox.store.listen(cb, loop=loop)  # type: ignore[call-arg]
        try:
            await until_heard()
            assert heard[0] == ("appended", threading.get_ident())
            assert not any(t.name == "outrelay-pg-listen" for t in threading.enumerate())
            (mine,) = set(listeners()) - before
            with psycopg.connect(pg_admin_url(), autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", (mine,))
            got.clear()
            await until_heard()  # reconnected (after a backoff of 0.5 s at most)
            assert set(listeners()) - before and mine not in listeners()
        finally:
            stop()
        stop()
        deadline = time.monotonic() + 5
        while set(listeners()) - before and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert not set(listeners()) - before

    def test_notify_false_does_not_listen(self, pg_schema: str) -> None:
        """With notify=false, appends send no notification and listen() is a no-op."""
        with Outbox.open(pg_url(pg_schema), notify=False) as ob:
            assert ob.store.listen(lambda w: None)() is None
            ob.append(ev())


class TestSchemaOptions:
    def test_schema_and_prefix_from_url_and_kwargs(self, pg_schema: str) -> None:
        """schema/prefix come from the URL query or Outbox.open keywords (keywords win)."""
        with Outbox.open(pg_url(pg_schema, prefix="ox_")) as ob:
            ob.append(ev())
        with Outbox.open(pg_url("ignored"), schema=pg_schema, prefix="ox_") as ob:
            assert len(ob.store.events()) == 1
        with psycopg.connect(pg_admin_url()) as conn:
            tables = {
                r[0]
                for r in conn.execute(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (pg_schema,)
                )
            }
        assert {"ox_events", "ox_deliveries", "ox_lanes", "ox_dead_letters", "ox_migrations"} <= tables

    def test_bad_options(self, pg_schema: str) -> None:
        """Invalid identifiers and unknown options are ConfigErrors."""
        with pytest.raises(ConfigError):
            PostgresStore(pg_url("bad-name"))
        with pytest.raises(ConfigError):
            PostgresStore(pg_url(pg_schema), colour="blue")
        with pytest.raises(ConfigError):
            PostgresStore(pg_url(pg_schema, pool_size="lots"))

    def test_unreachable_server_fails_fast_without_password(self) -> None:
        """An unreachable server is a StoreError within the connect timeout, password masked."""
        started = time.monotonic()
        with pytest.raises(StoreError) as info:
            PostgresStore("postgresql://u:hunter2@127.0.0.1:1/db?connect_timeout=2")
        assert time.monotonic() - started < 10
        assert "hunter2" not in str(info.value)

    def test_migration_sql_script_applies_and_is_recorded(self, pg_schema: str) -> None:
        """migration_sql() is a script a DBA can run; the store then opens with migrate=false."""
        sql = PostgresStore.migration_sql(pg_schema, "dba_")
        assert "CREATE TABLE" in sql and sql.strip().endswith("COMMIT;")
        with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
            conn.execute(sql.encode())  # a multi-statement script (simple query protocol)
        store = PostgresStore(pg_url(pg_schema, prefix="dba_", migrate="false"))
        try:
            assert store.schema_version() == len(MIGRATIONS)
            assert store.migrate() == []
        finally:
            store.close()

    def test_open_reports_migrations_applied(self, pg_schema: str) -> None:
        """The first open applies every migration and says so; the next applies none."""
        first = PostgresStore(pg_url(pg_schema))
        first.close()
        second = PostgresStore(pg_url(pg_schema))
        second.close()
        assert first.migrations_applied == list(range(1, len(MIGRATIONS) + 1))
        assert second.migrations_applied == []

    def test_routing_queue_migration_takes_over_the_unrouted_events(self, pg_schema: str) -> None:
        """An outbox at schema version 3 (routing by the events' routed flag) migrates to the routing
        queue: exactly its unrouted events are queued and routed once, history stays readable, rows any
        writer inserts afterwards, in plain SQL too, are queued by the trigger, and an event deleted by
        hand leaves the queue with it."""
        import orjson

        names = Names(pg_schema, "outrelay_")
        old = [ev("a", 1), ev("b", 2), ev("c", 3)]
        with psycopg.connect(pg_admin_url(), autocommit=True) as conn, conn.transaction():
            migrate_to(conn, names, 3)
            for e, routed in zip(old, (True, False, False), strict=True):
                conn.execute(
                    f"INSERT INTO {names.events} (id, stream, type, tenant, time, attrs, data, routed) "
                    "VALUES (%s, %s, %s, %s, %s, %s::jsonb, %s, %s)",
                    (e.id, e.stream, e.type, e.tenant, e.time.timestamp(), orjson.dumps(e.attributes()).decode(),
                     e.data, routed),
                )  # fmt: skip
        store = PostgresStore(pg_url(pg_schema))
        try:
            assert store.migrations_applied == list(range(4, len(MIGRATIONS) + 1)) and store.unrouted() == 2
            assert store.route(lambda e: ["d"], 100, T0) == 2
            claimed = store.claim("d", limit=10, per_lane=10, owner="r", lease_seconds=30, now=T0)
            assert sorted(c.event.id for c in claimed) == sorted(e.id for e in old[1:])
            assert [e.id for e in store.events()] == [e.id for e in old]
            new = ev("d", 4)
            with psycopg.connect(pg_admin_url(), autocommit=True) as conn:  # another writer's plain INSERT
                conn.execute(
                    f"INSERT INTO {names.events} (id, stream, type, time, attrs, data) "
                    "VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
                    (new.id, new.stream, new.type, new.time.timestamp(), orjson.dumps(new.attributes()).decode(),
                     new.data),
                )  # fmt: skip
            store.append([ev("e", 5), ev("e", 6)])
            assert store.unrouted() == 3
            with psycopg.connect(pg_admin_url(), autocommit=True) as conn:  # an operator deletes one by hand
                conn.execute(f"DELETE FROM {names.events} WHERE id = %s", (new.id,))
            assert store.unrouted() == 2 and store.route(lambda e: ["d"], 100, T0) == 2 and store.unrouted() == 0
        finally:
            store.close()

    def test_deliveries_key_migration_keeps_pending_deliveries(self, pg_schema: str) -> None:
        """An outbox at schema version 4 (deliveries keyed to events) migrates to version 5: the key
        is gone, the trigger that replaces it is there, deliveries queued before the upgrade are
        claimed and settled as before."""
        import orjson

        names = Names(pg_schema, "outrelay_")
        old = [ev("a", 1), ev("a", 2), ev("b", 3)]
        with psycopg.connect(pg_admin_url(), autocommit=True) as conn, conn.transaction():
            migrate_to(conn, names, 4)
            for e in old:
                conn.execute(
                    f"INSERT INTO {names.events} (id, stream, type, time, attrs, data) "
                    "VALUES (%s, %s, %s, %s, %s::jsonb, %s)",
                    (e.id, e.stream, e.type, e.time.timestamp(), orjson.dumps(e.attributes()).decode(), e.data),
                )
            # what a version-4 relay's routing leaves: the queue emptied into deliveries and lanes
            conn.execute(
                f"WITH q AS (DELETE FROM {names.unrouted} RETURNING seq, stream) "
                f"INSERT INTO {names.deliveries} (destination, stream, event_seq, created_at) "
                "SELECT 'd', stream, seq, 0 FROM q ORDER BY seq"
            )
            conn.execute(
                f"INSERT INTO {names.lanes} (destination, stream, due_at, pending) "
                "VALUES ('d', 'a', 0, 2), ('d', 'b', 0, 1)"
            )
            keys = (
                f"SELECT count(*) FROM pg_constraint WHERE conrelid = '{names.deliveries}'::regclass AND contype = 'f'"
            )
            assert conn.execute(keys).fetchone() == (1,)
        store = PostgresStore(pg_url(pg_schema))
        try:
            assert store.migrations_applied == [5, 6]  # 6: the delivery-attempt log
            with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
                assert conn.execute(keys).fetchone() == (0,)
                trigger = "SELECT tgname FROM pg_trigger WHERE tgrelid = %s::regclass AND NOT tgisinternal ORDER BY 1"
                assert [r[0] for r in conn.execute(trigger, (names.events,))] == [
                    "outrelay_events_deleted", "outrelay_queue_appended",
                ]  # fmt: skip
            claimed = store.claim("d", limit=10, per_lane=10, owner="r", lease_seconds=30, now=T0)
            assert [c.event.id for c in claimed] == [e.id for e in old]
            store.settle("d", "r", [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed], T0)
            assert store.next_due("d") is None and store.status(["d"], T0)[0].pending == 0
        finally:
            store.close()

    def test_event_deleted_by_hand_takes_its_deliveries_with_it(self, pg_schema: str) -> None:
        """Without the deliveries' foreign key, an event an operator deletes by hand (which the key
        used to refuse while it had deliveries) takes its deliveries with it: the rest of its lane is
        claimed in order and the lane goes away once settled, instead of staying due forever for a
        delivery nothing can send."""
        store = PostgresStore(pg_url(pg_schema))
        try:
            events = [ev("a", i) for i in range(3)]
            store.append(events)
            assert store.route(lambda e: ["d"], 100, T0) == 3
            with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
                conn.execute(f"DELETE FROM {store.n.events} WHERE id = %s", (events[1].id,))
                assert conn.execute(f"SELECT count(*) FROM {store.n.deliveries}").fetchone() == (2,)
            claimed = store.claim("d", limit=10, per_lane=10, owner="r", lease_seconds=30, now=T0)
            assert [c.event.id for c in claimed] == [events[0].id, events[2].id]
            store.settle("d", "r", [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed], T0)
            assert store.claim("d", limit=10, per_lane=10, owner="r", lease_seconds=30, now=T0 + 1) == []
            assert store.next_due("d") is None
        finally:
            store.close()

    def test_migrate_false_on_empty_schema_refuses(self, pg_schema: str) -> None:
        """Opening with migrate=false where no tables exist says to run `outrelay migrate`."""
        with pytest.raises(StoreError, match="outrelay migrate"):
            PostgresStore(pg_url(pg_schema, migrate="false"))

    def test_newer_schema_is_refused(self, pg_schema: str) -> None:
        """An outbox migrated by a newer outrelay is refused with a clear message."""
        PostgresStore(pg_url(pg_schema)).close()
        with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{pg_schema}".outrelay_migrations (version, name) VALUES (999, %s)', ("x",))
        with pytest.raises(StoreError, match="newer"):
            PostgresStore(pg_url(pg_schema))

    def test_concurrent_opens_migrate_once(self, pg_schema: str) -> None:
        """Several processes opening a new outbox at once migrate it exactly once."""
        errors: list[BaseException] = []

        def open_one() -> None:
            try:
                PostgresStore(pg_url(pg_schema)).close()
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=open_one) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        with psycopg.connect(pg_admin_url()) as conn:
            rows = conn.execute(f'SELECT version FROM "{pg_schema}".outrelay_migrations').fetchall()
        assert rows == [(v,) for v in range(1, len(MIGRATIONS) + 1)]


class TestRetention:
    def test_prune_deletes_in_batches(self, outbox: Outbox) -> None:
        """Pruning removes every eligible event, a small batch per transaction."""
        outbox.append([ev("s", i) for i in range(25)])
        drain_ids(outbox.store)  # type: ignore[arg-type]
        assert outbox.store.prune(time.time() + 60, batch=10, max_batches=1) == 10
        assert outbox.store.prune(time.time() + 60, batch=10) == 15
        assert outbox.store.events() == []

    def test_prune_does_not_wait_for_open_appends(self, outbox: Outbox, app_conn: psycopg.Connection) -> None:
        """An open application transaction neither blocks pruning nor loses its events to it."""
        outbox.append([ev("old", 0)])
        drain_ids(outbox.store)  # type: ignore[arg-type]
        pending = ev("new", 1)
        outbox.append(pending, conn=app_conn)  # uncommitted
        done: list[int] = []
        t = threading.Thread(target=lambda: done.append(outbox.store.prune(time.time() + 60)))
        t.start()
        t.join(timeout=10)
        assert done == [1]
        app_conn.commit()
        assert drain_ids(outbox.store) == [pending.id]  # type: ignore[arg-type]


class TestConcurrentRouting:
    def test_two_routers_keep_stream_order(self, pg_schema: str) -> None:
        """Relays routing at the same time still queue each stream's deliveries in event order."""
        stores = [PostgresStore(pg_url(pg_schema)) for _ in range(2)]
        appended = threading.Event()

        def appender() -> None:
            for i in range(300):
                stores[0].append([ev(f"s{i % 5}", i)])
            appended.set()

        def router(store: PostgresStore) -> None:
            while not (appended.is_set() and store.unrouted() == 0):
                store.route(lambda e: ["d"], 7, T0)

        threads = [threading.Thread(target=appender)] + [threading.Thread(target=router, args=(s,)) for s in stores]
        try:
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=60)
        finally:
            for s in stores:
                s.close()
        with psycopg.connect(pg_admin_url()) as conn:
            rows = conn.execute(
                f'SELECT stream, event_seq FROM "{pg_schema}".outrelay_deliveries ORDER BY id'
            ).fetchall()
        assert len(rows) == 300
        for stream in {r[0] for r in rows}:
            seqs = [r[1] for r in rows if r[0] == stream]
            assert seqs == sorted(seqs)
