"""The audit chain in the PostgreSQL outbox (see :mod:`outrelay.core.history.audit`).

A mixin of :class:`~outrelay.core.stores.postgres.PostgresStore`. Any number
of relays and operators append to one chain: each append takes the
transaction-scoped advisory lock ``hashtext('outrelay audit SCHEMA.PREFIX')``,
reads the last record (in a snapshot taken after the lock, so it sees the
previous holder's commit) and inserts after it; ``seq`` is the primary key,
so even a writer that skipped the lock could not fork the chain, only fail.
Routing and settling append as the *last* statement of their transaction:
the lock is held only while they commit, and never while waiting for a row
lock (no deadlock with another settle). Nothing here runs unless ``audit`` is
set (``[audit] enabled = true``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from outrelay.core.stores.audit_chain import AuditReads, AuditRecord, Chain, Entry, batch_details, settled_entries
from outrelay.core.stores.base import Settlement
from outrelay.core.stores.postgres_ops import PostgresParts

if TYPE_CHECKING:
    import psycopg

    Cursor = psycopg.Cursor[Any]

__all__ = ["PostgresAuditMixin"]


class PostgresAuditMixin(PostgresParts, AuditReads):
    """Appends, reads and the relay's batch records of the PostgreSQL audit chain."""

    _mark = "%s"
    #: set by the relay when ``[audit] enabled``: routing and settling then record
    audit: Chain | None = None

    def audit_append(self, chain: Chain, entries: Sequence[Entry], at: float) -> list[AuditRecord]:
        return self._run(lambda cur: self._audit_write(cur, chain, entries, at))

    def _audit_table(self) -> str:
        return self.n.audit

    def _audit_write(self, cur: Cursor, chain: Chain, entries: Sequence[Entry], at: float) -> list[AuditRecord]:
        if not entries:
            return []
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (self.n.audit_key,))
        cur.execute(f"SELECT seq, hash FROM {self.n.audit} ORDER BY seq DESC LIMIT 1")
        last = cur.fetchone()
        rows = chain.link((int(last[0]), str(last[1])) if last else None, entries, at)
        cur.executemany(self._audit_insert(), rows)
        return [AuditRecord(*r) for r in rows]

    def _audit_unrouted(self, cur: Cursor, limit: int) -> list[tuple[int, str]]:
        """The (seq, id) of the events routing takes next; routing then takes exactly these
        (it runs under the route lock, and events never become unrouted again)."""
        n = self.n
        cur.execute(
            f"SELECT u.seq, e.id FROM {n.unrouted} u JOIN {n.events} e ON e.seq = u.seq ORDER BY u.seq LIMIT %s",
            (limit,),
        )
        return [(int(r[0]), str(r[1])) for r in cur.fetchall()]

    def _audit_routed(self, cur: Cursor, routed: Sequence[tuple[int, str]], at: float) -> None:
        """Record the events routing just took; the transaction's last statement."""
        chain = self.audit
        if chain is None or not routed:
            return
        details = batch_details([r[1] for r in routed], [r[0] for r in routed])
        self._audit_write(cur, chain, [("append", chain.actor, details)], at)

    def _audit_settle_read(self, cur: Cursor, settlements: Sequence[Settlement]) -> dict[int, tuple[int, str]]:
        """``delivery id -> (seq, event id)`` of the deliveries a settle removes (read before it does)."""
        if self.audit is None:
            return {}
        found, ids = self.audit.recall(settlements)
        if not ids:
            return found
        cur.execute(  # not claimed through this chain (another process's claim): read them
            f"SELECT d.id, e.seq, e.id FROM {self.n.deliveries} d JOIN {self.n.events} e ON e.seq = d.event_seq "
            "WHERE d.id = ANY(%s)",
            (ids,),
        )
        return found | {int(r[0]): (int(r[1]), str(r[2])) for r in cur.fetchall()}

    def _audit_settled(
        self, cur: Cursor, destination: str, settlements: Sequence[Settlement], found: dict[int, tuple[int, str]],
        at: float,
    ) -> None:  # fmt: skip
        """Record a settled batch; the transaction's last statement."""
        chain = self.audit
        if chain is None or not found:
            return
        self._audit_write(cur, chain, settled_entries(chain, destination, settlements, found), at)
