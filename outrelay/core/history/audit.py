"""The tamper-evident audit chain (ADR-0005), kept in the outbox database.

Off unless ``[audit] enabled = true``. Then the outbox table
``outrelay_audit`` holds one record per

* **append** — per routing transaction of the relay: the events it took from
  the log (``count``, ``first_seq``/``last_seq``, ``ids_sha256``);
* **delivered** — per settled batch of a destination, same fields;
* **dead_letter** / **parked** — per event (rare): destination, event id,
  sequence, stream, attempts;
* **operator action** — ``enable``, ``disable``, ``replay``, ``dlq.replay``,
  ``dlq.purge``, and at each relay start ``relay.start`` plus
  ``config.change`` when the configuration differs from the last one recorded.

Batch records, never one per event: the relay's hot path pays one short
query and one insert per batch, in the batch's own transaction (an audit
record commits atomically with what it records). ``ids_sha256`` is the
SHA-256 hex digest of the event ids joined by ``"\\n"``, in sequence order
(appends) or settlement order (deliveries) — :func:`ids_digest`.

**Chain.** A record is ``seq`` (1, 2, 3, ... without gaps), ``at`` (Unix
seconds), ``kind``, ``actor``, ``details`` (JSON object), ``prev_hash`` (the
previous record's ``hash``; 64 zeros for the first), ``hash`` = SHA-256 hex of
``prev_hash`` followed by the canonical JSON (sorted keys, no spaces) of every
other field, and ``mac`` = HMAC-SHA256 hex of ``hash`` under ``hmac_key`` (or
NULL without a key). Appends to the chain are serialised (SQLite: the write
transaction; PostgreSQL: a transaction-scoped advisory lock taken by the
transaction's last statement), so relays never fork it.

**Guarantees and limits.** :func:`verify` finds an edited, deleted,
inserted or reordered record and names the first bad one. Without a key,
someone who rewrites a record *and* re-hashes every later record goes
unnoticed; with a key they cannot compute the MACs. Cutting records off the
end leaves a valid shorter chain: compare with a head recorded elsewhere
(``outrelay audit verify --expect-head SEQ:HASH``, from a previous export or
``outrelay audit head``). The HMAC key is never printed, logged or stored.
"""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import hmac
import os
import re
import socket
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import orjson

from outrelay.core.model.errors import ConfigError
from outrelay.core.stores.audit_chain import (
    GENESIS,
    AuditKey,
    AuditRecord,
    Chain,
    Entry,
    ids_digest,
    record_hash,
)

__all__ = [
    "GENESIS",
    "AuditKey",
    "AuditRecord",
    "AuditStore",
    "Chain",
    "Entry",
    "Verdict",
    "config_sections",
    "enable",
    "export_lines",
    "ids_digest",
    "operator_actor",
    "record_action",
    "record_hash",
    "record_start",
    "resolve_key",
    "verify",
]

#: how far :func:`verify` looks for the position a moved record was written at
_MOVE_SEARCH = 16
_SECRET_KEYS = re.compile(r"(secret|password|passwd|token|key|credential|connection_string|sasl)", re.I)


def resolve_key(ref: str | None) -> AuditKey | None:
    """The key named by ``env:VAR`` or ``file:/path`` (None: no key).

    :raises ConfigError: unset variable, unreadable file, or a key under 16
        bytes — naming the variable or path, never the key.
    """
    if ref is None:
        return None
    kind, _, name = ref.partition(":")
    if kind == "env":
        value = os.environ.get(name)
        if not value:
            raise ConfigError(f"audit.hmac_key: environment variable {name} is not set; export it (16+ bytes)")
        return AuditKey(value.encode())
    if kind == "file":
        try:
            data = Path(name).read_bytes().rstrip(b"\r\n")
        except OSError as exc:
            raise ConfigError(f"audit.hmac_key: cannot read key file {name!r}: {exc.strerror}") from None
        return AuditKey(data)
    raise ConfigError("audit.hmac_key must be env:VAR or file:/path")


@runtime_checkable
class AuditStore(Protocol):
    """What the audit chain needs from a store (the SQLite and PostgreSQL outboxes).

    ``audit`` set to a :class:`Chain` makes the store record appends (at
    routing), delivered batches and dead letters in their own transactions.
    """

    audit: Chain | None

    def audit_append(self, chain: Chain, entries: Sequence[Entry], at: float) -> list[AuditRecord]:
        """Append ``entries`` in one durable transaction; returns the records written."""
        ...

    def audit_page(self, after: int, limit: int) -> list[AuditRecord]:
        """Records with ``seq > after`` in seq order, at most ``limit``."""
        ...

    def audit_last(self, kind: str | None = None) -> AuditRecord | None:
        """The newest record (of ``kind``, if given)."""
        ...


def operator_actor() -> str:
    """``cli:USER@HOST`` for records of operator commands."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        user = f"uid{os.getuid()}"
    return f"cli:{user}@{socket.gethostname()}"


def config_sections(config: Any, key: AuditKey | None) -> dict[str, str]:
    """A digest per config section (``outbox``, ``relay``, ``destinations.NAME``, ...).

    With a key the digests are HMACs of the whole section; without one,
    secret-looking values are replaced by ``***`` first (a plain hash of a
    short password could be guessed), so a changed secret alone is then not
    seen as a change.
    """
    doc = config.model_dump(mode="json")
    parts: dict[str, Any] = {k: v for k, v in doc.items() if k != "destinations"}
    parts |= {f"destinations.{k}": v for k, v in doc.get("destinations", {}).items()}
    out: dict[str, str] = {}
    for name, value in sorted(parts.items()):
        text = orjson.dumps(value if key else _masked(value), option=orjson.OPT_SORT_KEYS)
        out[name] = key.mac(text.decode()) if key else hashlib.sha256(text).hexdigest()
    return out


def enable(store: Any, config: Any, actor: str) -> Chain:
    """Turn the chain on for ``store`` (routing and settling record from now on).

    :raises ConfigError: the store keeps no audit chain, or the key cannot be read.
    """
    if not isinstance(store, AuditStore):
        raise ConfigError(
            f"[audit] enabled = true, but the outbox store {type(store).__name__} keeps no audit chain; "
            "use the SQLite or PostgreSQL outbox, or set enabled = false"
        )
    chain = Chain(resolve_key(config.audit.hmac_key), actor)
    store.audit = chain
    return chain


def record_start(store: AuditStore, chain: Chain, config: Any, owner: str, at: float) -> None:
    """Record ``relay.start`` and, when the config's sections differ from the last
    start's, ``config.change`` naming the sections added, removed and changed."""
    sections = config_sections(config, chain.key)
    entries: list[Entry] = [("relay.start", chain.actor, {"owner": owner, "sections": sections})]
    last = store.audit_last("relay.start")
    if last is not None:
        try:
            before: dict[str, str] = orjson.loads(last.details).get("sections", {})
        except (orjson.JSONDecodeError, AttributeError):  # a tampered record: verify reports it
            before = {}
        diff = {
            "added": sorted(set(sections) - set(before)),
            "removed": sorted(set(before) - set(sections)),
            "changed": sorted(k for k in set(sections) & set(before) if sections[k] != before[k]),
        }
        if any(diff.values()):
            entries.insert(0, ("config.change", chain.actor, {**diff, "since_seq": last.seq}))
    store.audit_append(chain, entries, at)


def record_action(store: Any, config: Any, kind: str, details: dict[str, Any], at: float) -> None:
    """Record an operator action (``enable``, ``dlq.purge``, ...) when ``[audit] enabled``;
    nothing otherwise.

    :raises ConfigError: see :func:`enable`.
    """
    if not config.audit.enabled:
        return
    if not isinstance(store, AuditStore):
        enable(store, config, operator_actor())  # raises the one-line error
        return
    store.audit_append(
        Chain(resolve_key(config.audit.hmac_key), operator_actor()), [(kind, operator_actor(), details)], at
    )


def _masked(value: Any, key: str = "") -> Any:
    if isinstance(value, Mapping):
        return {k: _masked(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, key) for v in value]
    if isinstance(value, str) and _SECRET_KEYS.search(key):
        return "***"
    return value


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What :func:`verify` found. ``bad_seq``/``problem`` are None when the chain is intact."""

    checked: int
    head: AuditRecord | None
    bad_seq: int | None = None
    problem: str | None = None
    macs_checked: bool = False

    @property
    def ok(self) -> bool:
        return self.problem is None

    def line(self) -> str:
        """One line for people."""
        if not self.ok:
            return f"audit chain BROKEN at record {self.bad_seq}: {self.problem}"
        head = f"head {self.head.seq}:{self.head.hash}" if self.head else "empty"
        macs = "hashes and MACs" if self.macs_checked else "hashes only, no hmac_key"
        return f"audit chain intact: {self.checked} record(s) checked ({macs}); {head}"


def _records(store: AuditStore, page: int) -> Iterator[AuditRecord]:
    after = 0
    while rows := store.audit_page(after, page):
        yield from rows
        after = rows[-1].seq


def _own_hash(r: AuditRecord, seq: int) -> str | None:
    try:
        details = orjson.loads(r.details)
    except orjson.JSONDecodeError:
        return None
    return record_hash(seq, r.at, r.kind, r.actor, details, r.prev_hash)


def _written_as(r: AuditRecord) -> int | None:
    """The seq ``r`` was hashed with, when it is near its current one (a moved record)."""
    for d in range(1, _MOVE_SEARCH + 1):
        for seq in (r.seq - d, r.seq + d):
            if seq > 0 and _own_hash(r, seq) == r.hash:
                return seq
    return None


def verify(
    store: AuditStore, key: AuditKey | None = None, *, expect_head: tuple[int, str] | None = None, page: int = 1000
) -> Verdict:
    """Check the whole chain in seq order, in constant memory (``page`` records at a time).

    Stops at the first bad record: a gap in ``seq`` (deleted), a record whose
    content no longer matches its hash (edited), one hashed at another
    position (reordered, or inserted/deleted and renumbered), a ``prev_hash``
    that is not the previous record's hash (inserted or reordered), a wrong
    or missing MAC (with ``key``), or a chain that does not reach
    ``expect_head`` (cut short or rewritten).
    """
    prev: AuditRecord | None = None
    before: AuditRecord | None = None  # the record before prev
    checked = 0
    for r, ahead in _with_lookahead(_records(store, page)):  # one record ahead: to tell a swap
        problem = _check(r, prev, before, ahead, key)
        if problem is not None:
            return Verdict(checked, prev, problem[0], problem[1], key is not None)
        checked += 1
        before, prev = prev, r
    if expect_head is not None:
        seq, want = expect_head
        if prev is None or prev.seq < seq:
            have = prev.seq if prev else 0
            return Verdict(checked, prev, seq, f"the chain ends at record {have}: records up to {seq} were cut off")
        found = store.audit_page(seq - 1, 1)
        if not found or found[0].seq != seq or found[0].hash != want:
            return Verdict(checked, prev, seq, "its hash differs from the expected head: the chain was rewritten")
    return Verdict(checked, prev, macs_checked=key is not None)


def _with_lookahead(it: Iterator[AuditRecord]) -> Iterator[tuple[AuditRecord, AuditRecord | None]]:
    cur = next(it, None)
    while cur is not None:
        nxt = next(it, None)
        yield cur, nxt
        cur = nxt


def _check(
    r: AuditRecord, prev: AuditRecord | None, before: AuditRecord | None, ahead: AuditRecord | None,
    key: AuditKey | None,
) -> tuple[int, str] | None:  # fmt: skip
    """(bad seq, what is wrong) for record ``r`` following ``prev``, or None."""
    expected = prev.seq + 1 if prev else 1
    if r.seq != expected:
        gone = f"record {expected}" if r.seq == expected + 1 else f"records {expected}..{r.seq - 1}"
        return expected, f"{gone} missing (deleted): record {r.seq} follows record {expected - 1}"
    linked = r.prev_hash == (prev.hash if prev else GENESIS)
    if _own_hash(r, r.seq) != r.hash:
        moved = _written_as(r)
        if moved is None:
            if linked:
                return r.seq, "edited: its content no longer matches its hash"
            return r.seq, "edited or inserted: neither its content nor its prev_hash match the chain"
        if before is not None and moved == r.seq - 1 and r.prev_hash == before.hash:
            return r.seq - 1, f"inserted: record {r.seq} was written as record {moved} and follows record {moved - 1}"
        if ahead is not None and moved == r.seq + 1 and ahead.hash == r.prev_hash:
            return r.seq, f"reordered: records {r.seq} and {r.seq + 1} were swapped"
        why = "records before it deleted" if moved > r.seq else "a record inserted before it"
        return r.seq, f"renumbered: it was written as record {moved} ({why}, or records reordered)"
    if not linked:
        return r.seq, (
            f"inserted or reordered: its prev_hash is not the hash of record {r.seq - 1}"
            if prev
            else "inserted: the first record must follow the genesis hash"
        )
    if key is not None and (r.mac is None or not hmac.compare_digest(r.mac, key.mac(r.hash))):
        why = "has no MAC" if r.mac is None else "has a wrong MAC"
        return r.seq, f"forged: it {why} (edited or inserted without the key, or verified with another key)"
    return None


def export_lines(store: AuditStore, *, after: int = 0, page: int = 1000) -> Iterator[bytes]:
    """Each record with ``seq > after`` as one JSON line (no newline), in seq order."""
    while rows := store.audit_page(after, page):
        for r in rows:
            yield orjson.dumps(r.as_dict())
        after = rows[-1].seq
