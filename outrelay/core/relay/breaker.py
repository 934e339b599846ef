"""A destination's circuit breaker: stop hammering a destination that fails everything.

Configured per destination by ``[destinations.NAME.breaker]``
(:class:`~outrelay.core.config.config.BreakerConfig`). The destination's worker asks
it before each claim (:meth:`Breaker.probe_wait`) and gives it each batch's
outcomes (:meth:`Breaker.outcomes`).

* **closed** (normal): every attempt counts. A *failed attempt* is an event
  that failed retryably (:class:`RetryLater`; a whole batch failing or timing
  out counts each of its events); a *success* is a delivered event.
  :class:`NotSent` (not attempted) and :class:`Rejected` (the destination
  refused that one event) count as neither. ``failures`` failed attempts in a
  row open the breaker; so does ``failure_ratio`` of the attempts of the last
  ``window`` seconds, once there were ``min_attempts`` of them.
* **open**: the worker claims nothing but one *probe* per ``probe_interval``:
  one event, the head of one due stream, sent as usual. A delivered probe
  closes the breaker and the destination resumes at once. A probe that fails
  retryably is *held*: its event stays pending exactly as it was (no attempt
  counted, no backoff, the head of its stream), so no stream's order or retry
  count depends on the breaker. A rejected probe settles as any rejection
  would (dead letter or park); the breaker stays open. Batches that were in
  flight when it opened settle as usual (they were real attempts), and their
  outcomes do not change its state. ``outrelay run --drain`` does not wait
  for a destination whose breaker is open (as for a disabled one): its events
  stay pending and the run's summary counts them.

Each transition is one log line (WARNING when it opens, INFO when it closes)
and one ``outrelay_breaker_changed`` hook call (the metrics plugin counts
them); probes log at DEBUG. The state is this relay process's (several relays
of one outbox each have their own) and is kept in memory only: a restarted
relay starts closed. :meth:`Breaker.snapshot` is what ``/readyz`` shows;
the relay also writes it, while open, to table ``outrelay_breakers`` next to
the outbox (:func:`save_state`, best effort, SQLite and PostgreSQL outboxes),
from which ``outrelay status`` shows every relay's open breakers
(:func:`read_states`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import orjson

from outrelay.core.config.config import BreakerConfig
from outrelay.core.contract.transport import Delivered, NotSent, RetryLater, SendResult
from outrelay.core.stores.sidetables import side_table

__all__ = ["Breaker", "read_states", "save_state"]

log = logging.getLogger("outrelay.relay")

#: ``notify(destination, state, reason)`` on every transition (state "open" or "closed")
Notify = Callable[[str, str, str], None]


class Breaker:
    """The breaker of one destination (see the module docstring). Event-loop only."""

    def __init__(self, config: BreakerConfig, destination: str, notify: Notify | None = None) -> None:
        self.config = config
        self.destination = destination
        self._notify = notify
        self.open = False
        #: failed attempts in a row (closed), reset by a success
        self.consecutive = 0
        #: wall-clock time it opened, and probes sent since (open)
        self.opened_at: float | None = None
        self.probes = 0
        self.probing = False
        self.next_probe_at = 0.0
        #: the failure that opened it, then the latest failed probe's
        self.last_error: str | None = None
        #: something :func:`save_state` should write (a transition, a probe's outcome)
        self.dirty = False
        self._buckets: deque[list[int]] = deque()  # [second, attempts, failures], oldest first
        self._attempts = 0
        self._failed = 0

    # -- the worker's questions -----------------------------------------------------

    def probe_wait(self, now: float) -> float:
        """0 when a claim may go out now (closed, or a probe is due); else the seconds
        until the next probe (a probe in flight: ``probe_interval``, its end wakes the worker)."""
        if not self.open:
            return 0.0
        if self.probing:
            return self.config.probe_interval
        return max(0.0, self.next_probe_at - now)

    def start_probe(self, now: float) -> None:
        """A probe (one claimed event) goes out now; the next one is due one interval later."""
        self.probing = True
        self.probes += 1
        self.next_probe_at = now + self.config.probe_interval

    def probe_ended(self) -> None:
        """The probe's batch is over, whatever happened (settled, cut, or failed to settle)."""
        self.probing = False

    # -- outcomes ---------------------------------------------------------------

    def outcomes(self, results: Sequence[SendResult], *, probe: bool, now: float) -> Sequence[SendResult]:
        """Count a batch's ``results``; return what the batch should settle as: ``results``
        themselves, except that a probe's retryable failure becomes :class:`NotSent` (held)."""
        if probe:
            return self._probed(results, now)
        if self.open:  # a batch that was in flight when it opened: real attempts, no vote
            return results
        failed: str | None = None
        for r in results:
            if isinstance(r, Delivered):
                self.consecutive = 0
                self._count(now, 1, 0)
            elif isinstance(r, RetryLater) and not isinstance(r, NotSent):
                self.consecutive += 1
                self._count(now, 1, 1)
                failed = r.error
        if failed is not None and self._should_open():
            self._open(now, failed)
        return results

    def _probed(self, results: Sequence[SendResult], now: float) -> Sequence[SendResult]:
        self.dirty = True
        if any(isinstance(r, Delivered) for r in results):
            self._close(now)
            return results
        errors = [r.error for r in results if isinstance(r, RetryLater) and not isinstance(r, NotSent)]
        if errors:
            self.last_error = errors[0]
            log.debug(
                "destination %s: circuit breaker probe %d failed (%s); next probe in %.0fs",
                self.destination,
                self.probes,
                errors[0],
                max(0.0, self.next_probe_at - now),
                extra={"destination": self.destination},
            )
        return [NotSent(r.error, r.retry_after) if isinstance(r, RetryLater) else r for r in results]

    def _count(self, now: float, attempts: int, failures: int) -> None:
        second = int(now)
        buckets = self._buckets
        if buckets and buckets[-1][0] == second:
            buckets[-1][1] += attempts
            buckets[-1][2] += failures
        else:
            buckets.append([second, attempts, failures])
        self._attempts += attempts
        self._failed += failures
        horizon = now - self.config.window
        while buckets and buckets[0][0] < horizon:
            _, a, f = buckets.popleft()
            self._attempts -= a
            self._failed -= f

    def _should_open(self) -> bool:
        cfg = self.config
        if self.consecutive >= cfg.failures:
            return True
        ratio = cfg.failure_ratio
        return ratio is not None and self._attempts >= cfg.min_attempts and self._failed >= ratio * self._attempts

    # -- transitions --------------------------------------------------------------

    def _open(self, now: float, error: str) -> None:
        cfg = self.config
        if self.consecutive >= cfg.failures:
            why = f"{self.consecutive} failed attempts in a row"
        else:
            why = f"{self._failed} of {self._attempts} attempts failed in {cfg.window:g}s"
        self.open, self.opened_at, self.probes, self.last_error = True, now, 0, error
        self.dirty = True
        self.next_probe_at = now + cfg.probe_interval
        log.warning(
            "destination %s: circuit breaker open after %s (last: %s); one probe every %gs until one is delivered",
            self.destination,
            why,
            error,
            cfg.probe_interval,
            extra={"destination": self.destination, "error": error},
        )
        if self._notify is not None:
            self._notify(self.destination, "open", why)

    def _close(self, now: float) -> None:
        opened = self.opened_at or now
        self.open, self.opened_at, self.last_error = False, None, None
        self.consecutive = 0
        self._buckets.clear()
        self._attempts = self._failed = 0
        why = f"probe {self.probes} delivered after {now - opened:.1f}s open"
        log.info(
            "destination %s: circuit breaker closed: %s", self.destination, why, extra={"destination": self.destination}
        )
        if self._notify is not None:
            self._notify(self.destination, "closed", why)

    def snapshot(self) -> dict[str, Any]:
        """The state as plain values (``outrelay status --json``, ``/readyz``)."""
        if not self.open:
            return {"state": "closed", "consecutive_failures": self.consecutive}
        return {
            "state": "open",
            "opened_at": self.opened_at,
            "probes": self.probes,
            "next_probe_at": None if self.probing else self.next_probe_at,
            "probe_interval": self.config.probe_interval,
            "last_error": self.last_error,
        }

    def __repr__(self) -> str:
        return f"<Breaker {self.destination!r} {'open' if self.open else 'closed'}>"


# -- the state next to the outbox, for `outrelay status` ---------------------------------------

_DDL = (
    "CREATE TABLE IF NOT EXISTS {t} (destination TEXT NOT NULL, owner TEXT NOT NULL, state TEXT NOT NULL, "
    "updated_at {real} NOT NULL, PRIMARY KEY (destination, owner))"
)
#: rows of relays that stopped probing this long ago are deleted (a relay killed while its breaker was open)
_FORGET_AFTER = 7 * 86400.0


def save_state(url: str, destination: str, owner: str, snapshot: dict[str, Any], now: float) -> None:
    """Write ``owner``'s breaker state for ``destination`` (an open one) or delete it (closed).
    Blocking; nothing happens for an outbox other than SQLite or PostgreSQL.

    :raises StoreError: the database failed.
    """
    with side_table(url, "breakers", create=True) as t:
        if t is None:
            return
        t.execute(_DDL.replace("{real}", t.real))
        t.execute("DELETE FROM {t} WHERE (destination = ? AND owner = ?) OR updated_at < ?",
                  (destination, owner, now - _FORGET_AFTER))  # fmt: skip
        if snapshot.get("state") == "open":
            t.execute(
                "INSERT INTO {t} (destination, owner, state, updated_at) VALUES (?, ?, ?, ?)",
                (destination, owner, orjson.dumps(snapshot).decode(), now),
            )


def read_states(url: str, now: float) -> dict[str, list[dict[str, Any]]]:
    """The open breakers of the relays probing now, by destination: each a :meth:`Breaker.snapshot`
    plus ``owner`` (the relay) and ``updated_at``. A row not refreshed for three probe intervals
    (and 30 s) is left out: its relay stopped. Creates nothing.

    :raises StoreError: the database failed.
    """
    out: dict[str, list[dict[str, Any]]] = {}
    with side_table(url, "breakers", create=False) as t:
        if t is None or not t.exists():
            return out
        rows = t.execute("SELECT destination, owner, state, updated_at FROM {t} ORDER BY destination, owner")
        for destination, owner, state, updated_at in rows.fetchall():
            doc = orjson.loads(state)
            if now - float(updated_at) > 3 * float(doc.get("probe_interval") or 0) + 30:
                continue
            out.setdefault(destination, []).append({**doc, "owner": owner, "updated_at": float(updated_at)})
    return out
