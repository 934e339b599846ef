"""The audit chain in the SQLite and PostgreSQL outboxes: what the relay's
routing and settling record, and that `verify` names the first bad record
after each kind of tampering done with plain SQL."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from outrelay import Event
from outrelay.core.history.audit import GENESIS, AuditKey, AuditStore, Chain, ids_digest, record_hash, verify
from outrelay.core.stores.base import Settlement, Store
from tests.stores.conftest import pg_admin_url

KEY = AuditKey(b"audit-test-key-0123456789abcdef")
T0 = 1_700_000_000.0


def _sql(store: Any, stmt: str, args: tuple[Any, ...] = ()) -> list[Any]:
    """Run ``stmt`` (``{t}`` = the audit table, ``?`` placeholders) as a plain SQL client would."""
    if hasattr(store, "path"):
        db = sqlite3.connect(store.path)
        try:
            rows = db.execute(stmt.format(t="outrelay_audit"), args).fetchall()
            db.commit()
            return rows
        finally:
            db.close()
    import psycopg

    with psycopg.connect(pg_admin_url(), autocommit=True) as conn:
        cur = conn.execute(stmt.format(t=store.n.audit).replace("?", "%s"), args)
        return cur.fetchall() if cur.description else []


@pytest.fixture
def chain_store(store: Store) -> Iterator[AuditStore]:
    """A store with 8 operator records in its chain (hashes and MACs)."""
    assert isinstance(store, AuditStore)
    chain = Chain(KEY, "cli:test")
    for i in range(8):
        store.audit_append(chain, [("enable", "cli:test", {"destination": f"d{i}"})], T0 + i)
    yield store


class TestRecording:
    @pytest.mark.parametrize("remembered", [True, False], ids=["claimed-here", "claimed-elsewhere"])
    def test_routing_and_settling_record_batches_and_dead_letters(self, store: Store, remembered: bool) -> None:
        """One `append` record per routing pass, one `delivered` per settled batch, one per dead letter
        (whether the claim went through this chain or the settle has to read the batch)."""
        assert isinstance(store, AuditStore)
        chain = Chain(KEY, "relay:t")
        store.audit = chain
        events = [Event(type="order.created", stream=f"s{i % 2}", data={"i": i}) for i in range(6)]
        stored = store.append(events)
        assert store.route(lambda e: ["d"], 100, T0) == 6
        claimed = store.claim("d", limit=100, per_lane=100, owner="t", lease_seconds=30, now=T0)
        assert len(chain.claimed) == 6
        if not remembered:
            chain.claimed.clear()
        dead = claimed[0]
        outcomes = [Settlement(dead.delivery_id, dead.event.stream, "dead", 3, T0, "rejected: no")]
        outcomes += [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed[1:]]
        store.settle("d", "t", outcomes, T0)
        records = [r.as_dict() for r in store.audit_page(0, 100)]
        assert [r["kind"] for r in records] == ["append", "delivered", "dead_letter"]
        append, delivered, dead_letter = (r["details"] for r in records)
        assert append == {
            "count": 6,
            "first_seq": stored[0].sequence,
            "last_seq": stored[-1].sequence,
            "ids_sha256": ids_digest(e.id for e in events),
        }
        sent = [c.event.id for c in claimed[1:]]
        assert delivered["count"] == 5 and delivered["destination"] == "d"
        assert delivered["ids_sha256"] == ids_digest(sent)
        assert dead_letter["event_id"] == dead.event.id and dead_letter["attempts"] == 3
        assert all(r["actor"] == "relay:t" for r in records)
        assert chain.claimed == {}
        verdict = verify(store, KEY)
        assert verdict.ok and verdict.checked == 3 and verdict.macs_checked, verdict.line()

    def test_static_routing_records_exactly_what_it_routed(self, store: Store) -> None:
        """Routing without decoding (every event to fixed destinations) records each pass's events."""
        assert isinstance(store, AuditStore)
        store.audit = Chain(None, "relay:t")

        class Everywhere:
            static_destinations = ("a", "b")

            def __call__(self, event: Event) -> list[str]:
                return ["a", "b"]

        first = store.append([Event(type="order.created", stream="s", data=i) for i in range(5)])
        assert store.route(Everywhere(), 3, T0) == 3
        assert store.route(Everywhere(), 3, T0) == 2
        got = [r.as_dict()["details"] for r in store.audit_page(0, 10)]
        assert got == [
            {"count": 3, "first_seq": first[0].sequence, "last_seq": first[2].sequence,
             "ids_sha256": ids_digest(e.id for e in first[:3])},
            {"count": 2, "first_seq": first[3].sequence, "last_seq": first[4].sequence,
             "ids_sha256": ids_digest(e.id for e in first[3:])},
        ]  # fmt: skip

    def test_nothing_is_recorded_while_audit_is_off(self, store: Store) -> None:
        """Without a chain set, routing and settling write no audit record."""
        assert isinstance(store, AuditStore)
        store.append([Event(type="order.created", stream="s")])
        store.route(lambda e: ["d"], 100, T0)
        claimed = store.claim("d", limit=10, per_lane=10, owner="t", lease_seconds=30, now=T0)
        store.settle("d", "t", [Settlement(c.delivery_id, c.event.stream, "delivered") for c in claimed], T0)
        assert store.audit_page(0, 10) == []
        assert verify(store).ok and verify(store).head is None

    def test_records_hash_as_documented(self, chain_store: AuditStore) -> None:
        """hash = SHA-256(prev_hash + canonical JSON); the first follows the genesis hash."""
        first, second = chain_store.audit_page(0, 2)
        assert first.prev_hash == GENESIS and second.prev_hash == first.hash
        assert first.hash == record_hash(1, first.at, "enable", "cli:test", {"destination": "d0"}, GENESIS)
        assert first.mac == KEY.mac(first.hash)


class TestTampering:
    def test_untouched_chain_passes(self, chain_store: AuditStore) -> None:
        """An untouched chain verifies, with and without the key, and reports its head."""
        assert verify(chain_store, KEY).ok
        verdict = verify(chain_store, page=3)  # pages do not matter
        assert verdict.ok and verdict.checked == 8 and verdict.head is not None and verdict.head.seq == 8

    def test_edit_is_found(self, chain_store: AuditStore) -> None:
        """An UPDATE of one record's details names that record as edited."""
        _sql(chain_store, "UPDATE {t} SET details = ? WHERE seq = 4", ('{"destination":"evil"}',))
        verdict = verify(chain_store)
        assert (verdict.bad_seq, verdict.checked) == (4, 3)
        assert "edited" in (verdict.problem or "") and "record 4" in verdict.line()

    def test_delete_is_found(self, chain_store: AuditStore) -> None:
        """A DELETE in the middle names the missing record."""
        _sql(chain_store, "DELETE FROM {t} WHERE seq = 5")
        verdict = verify(chain_store)
        assert verdict.bad_seq == 5 and "deleted" in (verdict.problem or "")

    def test_rehashed_insert_is_found(self, chain_store: AuditStore) -> None:
        """A record inserted with a correct hash (later ones renumbered) is named as inserted."""
        _sql(chain_store, "UPDATE {t} SET seq = seq + 100 WHERE seq >= 3")
        _sql(chain_store, "UPDATE {t} SET seq = seq - 99 WHERE seq >= 103")
        prev = chain_store.audit_page(1, 1)[0]
        h = record_hash(3, T0, "disable", "cli:mallory", {"destination": "d"}, prev.hash)
        _sql(
            chain_store,
            "INSERT INTO {t} (seq, at, kind, actor, details, prev_hash, hash, mac) VALUES (3, ?, ?, ?, ?, ?, ?, NULL)",
            (T0, "disable", "cli:mallory", '{"destination":"d"}', prev.hash, h),
        )
        verdict = verify(chain_store)  # without the key the forged record itself looks fine...
        assert verdict.bad_seq == 3 and "inserted" in (verdict.problem or "")
        keyed = verify(chain_store, KEY)  # ...with it, it has no MAC
        assert keyed.bad_seq == 3 and "MAC" in (keyed.problem or "")

    def test_naive_insert_at_the_end_is_found(self, chain_store: AuditStore) -> None:
        """A row appended by hand with a made-up hash is named."""
        _sql(
            chain_store,
            "INSERT INTO {t} (seq, at, kind, actor, details, prev_hash, hash) "
            "VALUES (9, ?, 'enable', 'x', '{{}}', ?, ?)",
            (T0, "1" * 64, "2" * 64),
        )
        verdict = verify(chain_store)
        assert verdict.bad_seq == 9 and "inserted" in (verdict.problem or "")

    def test_reorder_is_found(self, chain_store: AuditStore) -> None:
        """Two records swapped by renumbering are named as reordered."""
        _sql(chain_store, "UPDATE {t} SET seq = 1000 WHERE seq = 6")
        _sql(chain_store, "UPDATE {t} SET seq = 6 WHERE seq = 7")
        _sql(chain_store, "UPDATE {t} SET seq = 7 WHERE seq = 1000")
        verdict = verify(chain_store)
        assert verdict.bad_seq == 6 and "reordered" in (verdict.problem or ""), verdict.line()

    def test_edit_rehashed_to_the_end_needs_the_key(self, chain_store: AuditStore) -> None:
        """Re-hashing every record after an edit fools hashes alone, not the MACs."""
        rows = chain_store.audit_page(0, 100)
        prev = rows[1].hash
        for r in rows[2:]:
            details = {"destination": "evil"} if r.seq == 3 else {"destination": f"d{r.seq - 1}"}
            h = record_hash(r.seq, r.at, r.kind, r.actor, details, prev)
            text = '{"destination":"evil"}' if r.seq == 3 else r.details
            _sql(
                chain_store, "UPDATE {t} SET details = ?, prev_hash = ?, hash = ? WHERE seq = ?", (text, prev, h, r.seq)
            )
            prev = h
        assert verify(chain_store).ok
        keyed = verify(chain_store, KEY)
        assert keyed.bad_seq == 3 and "MAC" in (keyed.problem or "")

    def test_truncation_is_found_against_a_head(self, chain_store: AuditStore) -> None:
        """Deleting the newest records passes alone, not against a head kept elsewhere."""
        head = chain_store.audit_last()
        assert head is not None
        _sql(chain_store, "DELETE FROM {t} WHERE seq >= 7")
        assert verify(chain_store).ok
        verdict = verify(chain_store, expect_head=(head.seq, head.hash))
        assert verdict.bad_seq == 8 and "cut off" in (verdict.problem or "")


def test_concurrent_writers_never_fork_the_chain(store: Store) -> None:
    """Four threads appending at once leave one unbroken chain (PostgreSQL: the advisory lock)."""
    assert isinstance(store, AuditStore)
    chain = Chain(None, "t")
    errors: list[BaseException] = []

    def work(n: int) -> None:
        try:
            for i in range(15):
                store.audit_append(chain, [("enable", f"t{n}", {"i": i})], time.time())
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    verdict = verify(store)
    assert verdict.ok and verdict.checked == 60, verdict.line()


def test_relays_on_postgres_share_one_chain(pg_schema: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two relays draining one PostgreSQL outbox with [audit] on leave one intact chain covering every event."""
    import asyncio

    from outrelay import Outbox, Relay, parse_config
    from outrelay.transports.memory import MemoryTransport
    from tests.stores.conftest import pg_url

    monkeypatch.setenv("OUTRELAY_TEST_AUDIT_KEY", "k" * 32)
    relays = 2
    url = pg_url(pg_schema)
    raw = {
        "outbox": {"url": url},
        "audit": {"enabled": True, "hmac_key": "env:OUTRELAY_TEST_AUDIT_KEY"},
        "destinations": {"mem": {"transport": "memory", "broker": "audit-pg", "batch_size": 50}},
    }
    with Outbox.open(url) as outbox:
        outbox.append([Event(type="order.created", stream=f"s{i % 7}", data=i) for i in range(400)])

    async def run_all() -> None:
        await asyncio.gather(*(Relay(url, parse_config(raw)).run(drain=True) for _ in range(relays)))

    asyncio.run(run_all())
    assert len({m.event.id for m in MemoryTransport.broker("audit-pg").all()}) == 400
    with Outbox.open(url) as outbox:
        store = outbox.store
        assert isinstance(store, AuditStore)
        verdict = verify(store, AuditKey(b"k" * 32))
        assert verdict.ok, verdict.line()
        docs = [r.as_dict() for r in store.audit_page(0, 10_000)]
    assert sum(d["details"]["count"] for d in docs if d["kind"] == "append") == 400
    assert sum(d["details"]["count"] for d in docs if d["kind"] == "delivered") >= 400
    assert len({d["actor"] for d in docs if d["kind"] == "relay.start"}) == relays
