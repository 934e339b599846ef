"""The audit chain in the SQLite outbox (see :mod:`outrelay.core.history.audit`).

A mixin of :class:`~outrelay.core.stores.sqlite.SQLiteStore`. Records are
appended inside the caller's write transaction — routing's, settling's, or
a durable one of their own for operator actions — so SQLite's single writer
serialises the chain: two appends can never take the same ``seq``.
Nothing here runs unless ``audit`` is set (``[audit] enabled = true``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from outrelay.core.stores.audit_chain import AuditReads, AuditRecord, Chain, Entry, batch_details, settled_entries
from outrelay.core.stores.base import Settlement
from outrelay.core.stores.sqlite_ops import SQLiteParts

__all__ = ["SQLiteAuditMixin"]


class SQLiteAuditMixin(SQLiteParts, AuditReads):
    """Appends, reads and the relay's batch records of the SQLite audit chain."""

    _mark = "?"
    #: set by the relay when ``[audit] enabled``: routing and settling then record
    audit: Chain | None = None

    def audit_append(self, chain: Chain, entries: Sequence[Entry], at: float) -> list[AuditRecord]:
        with self._tx() as db:  # durable: an operator action's record must survive a power cut
            return self._audit_write(db, chain, entries, at)

    def _audit_table(self) -> str:
        return "outrelay_audit"

    def _audit_write(
        self, db: sqlite3.Connection, chain: Chain, entries: Sequence[Entry], at: float
    ) -> list[AuditRecord]:
        last = db.execute("SELECT seq, hash FROM outrelay_audit ORDER BY seq DESC LIMIT 1").fetchone()
        rows = chain.link(tuple(last) if last else None, entries, at)
        db.executemany(self._audit_insert(), rows)
        return [AuditRecord(*r) for r in rows]

    def _audit_routed(self, db: sqlite3.Connection, after: int, last: int, at: float) -> None:
        """Record the events ``after < seq <= last`` that routing just took (one record)."""
        chain = self.audit
        if chain is None or last <= after:
            return
        rows = db.execute(
            "SELECT seq, id FROM outrelay_events WHERE seq > ? AND seq <= ? ORDER BY seq", (after, last)
        ).fetchall()
        if rows:
            details = batch_details([r[1] for r in rows], [r[0] for r in rows])
            self._audit_write(db, chain, [("append", chain.actor, details)], at)

    def _audit_settled(
        self, db: sqlite3.Connection, destination: str, settlements: Sequence[Settlement], at: float
    ) -> None:
        """Record a settled batch: one ``delivered`` record, one per dead letter (read before the
        settlement deletes the deliveries, in its transaction)."""
        chain = self.audit
        if chain is None:
            return
        found, ids = chain.recall(settlements)
        for lo in range(0, len(ids), 500):  # not claimed through this chain: read (under SQLite's variable limit)
            chunk = ids[lo : lo + 500]
            found.update(
                (d_id, (seq, ev_id))
                for d_id, seq, ev_id in db.execute(
                    "SELECT d.id, e.seq, e.id FROM outrelay_deliveries d JOIN outrelay_events e "
                    f"ON e.seq = d.event_seq WHERE d.id IN ({','.join('?' * len(chunk))})",
                    chunk,
                )
            )
        if not found:
            return
        self._audit_write(db, chain, settled_entries(chain, destination, settlements, found), at)
