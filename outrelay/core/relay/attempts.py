"""The delivery-attempt log: every attempt of an event to a destination, kept in the outbox.

Off by default; ``[attempts] enabled = true`` turns it on (off, nothing is
built, written or read on the hot path). For every event a destination's
transport attempted, the settle that records the outcome also inserts one
row into ``outrelay_attempts`` (PostgreSQL: ``<prefix>attempts``) in the same
transaction — for PostgreSQL as one more statement of the settle's single
message, so the hot path keeps its one round trip. A row holds:

* ``at`` — when the batch holding the attempt was handed to the transport
  (Unix seconds); ``latency`` — how long that send took, in seconds (the
  batch's duration: exact for a batch of one event, an upper bound otherwise);
* ``attempt`` — the delivery's attempt number (1, 2, ...; a replayed or
  re-queued event counts from 1 again; a held attempt is not counted, so
  the next one has the same number);
* ``outcome`` — one of :data:`OUTCOMES`: ``delivered``; ``retry`` (failed,
  retried after backoff); ``rejected`` (refused permanently: dead-lettered,
  or parked by the route's policy; a 410 disabling the destination too);
  ``dead-lettered`` / ``parked`` (retries exhausted); ``hold`` (attempted,
  left pending as it was: a circuit breaker's failed probe);
* ``error`` — the failure's text; ``detail`` — the transport's
  :attr:`~outrelay.core.contract.transport.SendResult.detail` as JSON (webhook:
  ``{"status": 500, "body": "<first 512 bytes>"}``), string values cut to
  ``detail_bytes``.

A message the transport did not attempt (:class:`NotSent`: an earlier event
of its stream failed, the deadline was near, the relay was stopping) leaves
no row. Retention: the relay deletes rows older than ``keep_days`` once a
minute, and writing an attempt past ``keep_per_event`` deletes the older
rows of that event and destination beyond the newest ``keep_per_event``.

``outrelay attempts`` reads the log (:func:`read`); ``outrelay retry
--event ID`` re-sends one event now (:func:`retry_event`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import orjson

from outrelay.core.config.config import AttemptsConfig
from outrelay.core.contract.transport import Detail, NotSent, Rejected, SendResult
from outrelay.core.model.errors import StoreError
from outrelay.core.stores.base import Attempt, Claimed, Settlement

__all__ = ["OUTCOMES", "AttemptLog", "AttemptRows", "AttemptStore", "encode_detail", "read", "retry_event"]

#: the values of an attempt's ``outcome``
OUTCOMES = ("delivered", "retry", "rejected", "dead-lettered", "parked", "hold")

_ERROR_CHARS = 2000
_FIELDS = ("id", "at", "event_id", "event_seq", "destination", "stream", "attempt", "outcome", "latency", "error")


@runtime_checkable
class AttemptStore(Protocol):
    """What a store offers for the log (the SQLite and PostgreSQL stores do)."""

    attempts_keep: int | None

    def attempts(
        self,
        *,
        event_id: str | None = None,
        stream: str | None = None,
        destination: str | None = None,
        since: float | None = None,
        limit: int = 100,
    ) -> list[tuple[Any, ...]]: ...

    def prune_attempts(self, older_than: float, *, batch: int = 1000) -> int: ...

    def retry_event(
        self, event_id: str, *, destination: str | None, redeliver: bool, now: float
    ) -> list[tuple[str, str]]: ...


def encode_detail(detail: Detail, limit: int) -> str:
    """``detail`` as stored: "" for None, a string cut to ``limit`` characters, or a mapping as
    JSON with each string value cut to ``limit`` (values JSON cannot hold become strings)."""
    if detail is None:
        return ""
    if isinstance(detail, str):
        return detail[:limit]
    if isinstance(detail, Mapping):
        cut = {str(k): v[:limit] if isinstance(v, str) else v for k, v in detail.items()}
        return orjson.dumps(cut, default=str).decode()
    return str(detail)[:limit]


class AttemptRows(list[Attempt]):
    """The attempt-log rows of one settle as :meth:`AttemptLog.mark` builds them: a list of
    :data:`~outrelay.core.stores.base.Attempt` tuples like any other, plus what a store may use
    instead of reading every row again.

    ``plain`` is ``(at, attempt, latency)`` when every row is a ``delivered`` attempt with no
    error or detail, attempt number ``attempt``, and the batch's ``at`` and ``latency`` (so the
    rows differ only in their events), else None; ``seqs`` is then the rows' event sequences,
    in row order. A store must give the same result with or without them."""

    __slots__ = ("plain", "seqs")

    def __init__(self) -> None:
        super().__init__()
        self.plain: tuple[float, int, float] | None = None
        self.seqs: list[int] = []


class AttemptLog:
    """The relay's side of the log: marks settlements with their attempts, in the event loop."""

    def __init__(self, config: AttemptsConfig) -> None:
        self.config = config

    def mark(
        self,
        destination: str,
        claimed: Sequence[Claimed],
        results: Sequence[SendResult],
        settlements: Sequence[Settlement],
        at: float,
        latency: float,
    ) -> AttemptRows:
        """The attempt-log rows of a settled batch (``settlements``: one per claimed delivery, in
        order), for :meth:`Store.settle`; none for a message the transport did not attempt
        (``results`` NotSent). ``plain`` and ``seqs`` are set when every row is a plain delivered
        one of one attempt number (see :class:`AttemptRows`)."""
        limit = self.config.detail_bytes
        out = AttemptRows()
        seqs = out.seqs
        first = claimed[0].attempts if claimed else 0
        plain = True  # so far every row a delivered one without detail, of attempt number first + 1
        for c, r, s in zip(claimed, results, settlements, strict=True):
            kind = s.kind
            if kind == "delivered":  # most: no error, the attempt number from the claim
                detail = r.detail  # type: ignore[attr-defined]
                text = "" if detail is None else encode_detail(detail, limit)
                seq = c.event.sequence or 0
                out.append((at, c.event.id, seq, destination, s.stream, c.attempts + 1,
                            "delivered", latency, "", text))  # fmt: skip
                seqs.append(seq)
                plain = plain and not text and c.attempts == first
                continue
            plain = False
            if isinstance(r, NotSent):
                continue
            if kind == "hold":
                outcome, number = "hold", c.attempts + 1
            elif isinstance(r, Rejected):
                outcome, number = "rejected", s.attempts
            elif kind == "retry":
                outcome, number = "retry", s.attempts
            else:
                outcome, number = ("parked" if kind == "park" else "dead-lettered"), s.attempts
            detail = encode_detail(getattr(r, "detail", None), limit)
            out.append((at, c.event.id, c.event.sequence or 0, destination, s.stream, number, outcome, latency,
                        _error(r), detail))  # fmt: skip
        if plain and out:
            out.plain = (at, first + 1, latency)
        else:
            out.seqs = []
        return out


def _error(result: SendResult) -> str:
    text = getattr(result, "error", None) or getattr(result, "reason", None) or ""
    return str(text)[:_ERROR_CHARS]


def as_dict(row: Sequence[Any]) -> dict[str, Any]:
    """One row of :meth:`AttemptStore.attempts` as the JSON object ``outrelay attempts --json`` prints:
    ``detail`` decoded (a JSON object, a string, or null)."""
    out = dict(zip(_FIELDS, row[:10], strict=True))
    out["at"], out["latency"] = float(out["at"]), None if out["latency"] is None else float(out["latency"])
    raw = row[10] or ""
    detail: Any = None
    if raw:
        try:
            detail = orjson.loads(raw) if raw.startswith("{") else raw
        except orjson.JSONDecodeError:
            detail = raw
    out["detail"] = detail
    out["error"] = out["error"] or None
    return out


def _store(store: Any) -> AttemptStore:
    if not isinstance(store, AttemptStore):
        raise StoreError(f"{type(store).__name__} keeps no delivery-attempt log; use the SQLite or PostgreSQL outbox")
    return store


def read(
    store: Any,
    *,
    event_id: str | None = None,
    stream: str | None = None,
    destination: str | None = None,
    since: float | None = None,
    limit: int = 100,
) -> list[dict[str, Any]]:
    """Logged attempts matching every filter given, newest first (see :func:`as_dict`).

    :raises StoreError: the store keeps no log, or the database failed."""
    rows = _store(store).attempts(event_id=event_id, stream=stream, destination=destination, since=since, limit=limit)
    return [as_dict(r) for r in rows]


def retry_event(
    store: Any, event_id: str, *, destination: str | None = None, redeliver: bool = False, now: float
) -> list[tuple[str, str]]:
    """Send event ``event_id`` again now, to every destination (or ``destination``) where it is
    not delivered: a delivery waiting in backoff becomes due at once (its stream's head goes
    first: order holds), a dead letter is queued again, a parked one unparks its stream. An event
    delivered everywhere is left alone, unless ``redeliver`` (with ``destination``) queues it
    again there, as ``outrelay replay`` would. Returns ``(destination, what was done)`` pairs,
    empty when nothing was to do.

    :raises NotFoundError: no such event, or ``redeliver`` without ``destination``.
    :raises StoreError: the store keeps no log, or the database failed."""
    return _store(store).retry_event(event_id, destination=destination, redeliver=redeliver, now=now)
