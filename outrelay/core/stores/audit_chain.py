"""The audit chain's records and how they link (see :mod:`outrelay.core.history.audit`).

What a store needs to append to the chain: :class:`Chain` links entries to
the last record (hash, MAC), and remembers the (seq, id) of the deliveries a
relay claimed so that settling a batch describes it without reading it back;
:func:`batch_details` and :func:`settled_entries` build the relay's records.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import orjson

from outrelay.core.model.errors import ConfigError
from outrelay.core.stores.base import Claimed, Settlement

__all__ = [
    "GENESIS",
    "AuditKey",
    "AuditReads",
    "AuditRecord",
    "Chain",
    "Entry",
    "batch_details",
    "canonical",
    "ids_digest",
    "record_hash",
    "settled_entries",
]

#: the ``prev_hash`` of the first record
GENESIS = "0" * 64
#: (kind, actor, details) of a record to append; the chain adds the rest
Entry = tuple[str, str, dict[str, Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class AuditRecord:
    """One stored record; ``details`` is the JSON text as stored."""

    seq: int
    at: float
    kind: str
    actor: str
    details: str
    prev_hash: str
    hash: str
    mac: str | None

    def as_dict(self) -> dict[str, Any]:
        """The record as one JSON-ready object (``details`` parsed when it is JSON)."""
        try:
            details: Any = orjson.loads(self.details)
        except orjson.JSONDecodeError:
            details = self.details
        return {**dataclasses.asdict(self), "details": details}


#: the audit table's columns, in :class:`AuditRecord`'s order
COLUMNS = "seq, at, kind, actor, details, prev_hash, hash, mac"


class AuditReads:
    """The reads of a store's audit chain, one text for both SQL stores: :meth:`audit_page` and
    :meth:`audit_last` run through the store's ``_q`` on the table :meth:`_audit_table` names,
    with ``_mark`` (``?`` or ``%s``) as the parameter placeholder."""

    _mark: ClassVar[str]

    if TYPE_CHECKING:

        def _q(self, sql: str, args: Sequence[Any] = ()) -> list[Any]: ...

    def _audit_table(self) -> str:
        """The audit table's (qualified) name."""
        raise NotImplementedError

    def _audit_insert(self) -> str:
        """The statement that appends one record (its columns in :class:`AuditRecord`'s order)."""
        return f"INSERT INTO {self._audit_table()} ({COLUMNS}) VALUES ({', '.join([self._mark] * 8)})"

    def audit_page(self, after: int, limit: int) -> list[AuditRecord]:
        """Records with ``seq > after`` in seq order, at most ``limit``."""
        t, p = self._audit_table(), self._mark
        rows = self._q(f"SELECT {COLUMNS} FROM {t} WHERE seq > {p} ORDER BY seq LIMIT {p}", (after, limit))
        return [AuditRecord(*r) for r in rows]

    def audit_last(self, kind: str | None = None) -> AuditRecord | None:
        """The newest record (of ``kind``, if given), or None."""
        t, p = self._audit_table(), self._mark
        if kind is None:
            rows = self._q(f"SELECT {COLUMNS} FROM {t} ORDER BY seq DESC LIMIT 1")
        else:
            rows = self._q(f"SELECT {COLUMNS} FROM {t} WHERE kind = {p} ORDER BY seq DESC LIMIT 1", (kind,))
        return AuditRecord(*rows[0]) if rows else None


class AuditKey:
    """An HMAC key. Its repr and str never show the bytes."""

    __slots__ = ("_key",)

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ConfigError(
                "audit.hmac_key: the key must be at least 16 bytes; generate one with `openssl rand -hex 32`"
            )
        self._key = key

    def mac(self, record_hash: str) -> str:
        return hmac.new(self._key, record_hash.encode(), hashlib.sha256).hexdigest()

    def __repr__(self) -> str:
        return "<AuditKey ***>"

    __str__ = __repr__


def ids_digest(ids: Iterable[str]) -> str:
    """SHA-256 hex of the event ids joined by newlines (what ``ids_sha256`` holds)."""
    return hashlib.sha256("\n".join(ids).encode()).hexdigest()


def canonical(seq: int, at: float, kind: str, actor: str, details: Any, prev_hash: str) -> bytes:
    doc = {"seq": seq, "at": at, "kind": kind, "actor": actor, "details": details, "prev_hash": prev_hash}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS)


def record_hash(seq: int, at: float, kind: str, actor: str, details: Any, prev_hash: str) -> str:
    """SHA-256 hex of ``prev_hash`` followed by the canonical JSON of the other fields."""
    return hashlib.sha256(prev_hash.encode() + canonical(seq, at, kind, actor, details, prev_hash)).hexdigest()


class Chain:
    """Links new records to the last one; what a store needs to append.

    ``actor`` is the default actor of the records this process writes.
    ``claimed`` maps the delivery ids of this relay's claims to their event's
    (seq, id), so settling a batch needs no read to describe it; each settle
    takes its deliveries out again, so it holds only what is in flight.
    """

    def __init__(self, key: AuditKey | None, actor: str) -> None:
        self.key = key
        self.actor = actor
        self.claimed: dict[int, tuple[int, str]] = {}

    def remember(self, claimed: Iterable[Claimed]) -> None:
        """Note the (seq, id) of claimed deliveries (called by the store's claim)."""
        self.claimed.update((c.delivery_id, (c.event.sequence or 0, c.event.id)) for c in claimed)

    def recall(self, settlements: Sequence[Settlement]) -> tuple[dict[int, tuple[int, str]], list[int]]:
        """Forget ``settlements``' deliveries; return (seq, id) of those that leave the
        outbox (delivered, dead, parked) and the ids of such deliveries never remembered."""
        found: dict[int, tuple[int, str]] = {}
        missing: list[int] = []
        pop = self.claimed.pop
        for s in settlements:
            known = pop(s.delivery_id, None)
            if s.kind in ("delivered", "dead", "park"):
                if known is None:
                    missing.append(s.delivery_id)
                else:
                    found[s.delivery_id] = known
        return found, missing

    def link(self, last: tuple[int, str] | None, entries: Sequence[Entry], at: float) -> list[tuple[Any, ...]]:
        """Rows ``(seq, at, kind, actor, details, prev_hash, hash, mac)`` that follow
        ``last`` (its seq and hash; None: the chain is empty)."""
        seq, prev = last if last is not None else (0, GENESIS)
        rows: list[tuple[Any, ...]] = []
        for kind, actor, details in entries:
            seq += 1
            h = record_hash(seq, at, kind, actor, details, prev)
            text = orjson.dumps(details, option=orjson.OPT_SORT_KEYS).decode()
            rows.append((seq, at, kind, actor, text, prev, h, self.key.mac(h) if self.key else None))
            prev = h
        return rows

    def __repr__(self) -> str:
        return f"<Chain actor={self.actor!r} hmac={'yes' if self.key else 'no'}>"


def batch_details(ids: Sequence[str], seqs: Sequence[int], **extra: Any) -> dict[str, Any]:
    """The details of an ``append``/``delivered`` record for events ``ids`` (sequences ``seqs``)."""
    return {**extra, "count": len(ids), "first_seq": min(seqs), "last_seq": max(seqs), "ids_sha256": ids_digest(ids)}


def settled_entries(
    chain: Chain, destination: str, settlements: Sequence[Settlement], found: dict[int, tuple[int, str]]
) -> list[Entry]:
    """The records of a settled batch, given ``delivery id -> (seq, event id)`` of its deliveries."""
    delivered = [found[s.delivery_id] for s in settlements if s.kind == "delivered" and s.delivery_id in found]
    entries: list[Entry] = []
    if delivered:
        details = batch_details([d[1] for d in delivered], [d[0] for d in delivered], destination=destination)
        entries.append(("delivered", chain.actor, details))
    for s in settlements:
        if s.kind in ("dead", "park") and s.delivery_id in found:
            seq, ev_id = found[s.delivery_id]
            doc = {
                "destination": destination,
                "event_id": ev_id,
                "seq": seq,
                "stream": s.stream,
                "attempts": s.attempts,
            }
            entries.append(("dead_letter" if s.kind == "dead" else "parked", chain.actor, doc))
    return entries
