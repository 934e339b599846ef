"""Liveness and readiness of a running relay, served next to ``/metrics``.

``/healthz`` answers 200 while the process serves HTTP at all (liveness: restart
it when this fails). ``/readyz`` answers 200 only when the relay is ready to do
its job, else 503 with one line per reason:

- the relay loop has started (its transports were built and its store opened);
- the outbox answers a query within :data:`STORE_TIMEOUT` seconds;
- every destination's transport opened (an operator-disabled one counts as ready);
- no destination has been failing — every delivery or open attempt, without a
  single success — for longer than the stall threshold
  (:data:`DEFAULT_STALL_AFTER`, 300 s; ``outrelay run --ready-stall-after``);
- no destination's circuit breaker (``[destinations.NAME.breaker]``) is open:
  it opens only after the configured run of failures, which is the point where
  a human should look too.

A destination in a short outage stays ready: retries with backoff are normal
operation, and pulling the relay out of a load balancer does not help it. The
threshold marks the point where a human should look.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from outrelay.core.config.hookspecs import hookimpl

__all__ = ["DEFAULT_STALL_AFTER", "STORE_TIMEOUT", "Health", "Readiness"]

#: seconds a destination may fail without one success before /readyz reports it stalled
DEFAULT_STALL_AFTER = 300.0
#: seconds the outbox gets to answer the readiness query
STORE_TIMEOUT = 2.0


@dataclass(frozen=True)
class Readiness:
    """The verdict of :meth:`Health.readiness`: ``ready``, and why not (one short line each)."""

    ready: bool
    reasons: tuple[str, ...]

    def body(self) -> str:
        return "ready\n" if self.ready else "".join(f"not ready: {r}\n" for r in self.reasons)


class Health:
    """A plugin that learns when the relay runs; :meth:`readiness` applies the checks above."""

    def __init__(self, relay: Any, stall_after: float = DEFAULT_STALL_AFTER) -> None:
        self.relay = relay
        self.stall_after = stall_after
        # already running when created late (embedding code that starts the server after run())
        self.running = bool(getattr(relay, "workers", None)) and not relay.stopping

    @hookimpl
    def outrelay_relay_started(self, relay: Any) -> None:
        if relay is self.relay:
            self.running = True

    @hookimpl
    def outrelay_relay_stopped(self, relay: Any) -> None:
        if relay is self.relay:
            self.running = False

    async def readiness(self) -> Readiness:
        """Apply the checks; never raises (a failing check is a reason)."""
        relay = self.relay
        if not self.running:
            return Readiness(False, ("relay not running (starting, or stopping)",))
        reasons: list[str] = []
        workers = dict(relay.workers)
        try:
            await asyncio.wait_for(relay.db(relay.store.unrouted), STORE_TIMEOUT)
        except TimeoutError:
            reasons.append(f"outbox did not answer within {STORE_TIMEOUT:.0f}s")
        except Exception as exc:  # the store's own error, already one line and masked
            reasons.append(f"outbox unreachable: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}")
        for name, w in sorted(workers.items()):
            if w.disabled:
                continue
            outage = w.outage_seconds()
            breaker = getattr(w, "breaker", None)
            if not w.opened:
                reasons.append(f"destination {name}: transport not opened yet")
            elif breaker is not None and breaker.open:
                reasons.append(
                    f"destination {name}: circuit breaker open for {time.time() - breaker.opened_at:.0f}s "
                    f"({breaker.probes} probe(s) sent): {_short(breaker.last_error)}"
                )
            elif outage is not None and outage > self.stall_after:
                reasons.append(
                    f"destination {name}: failing for {outage:.0f}s (> {self.stall_after:.0f}s): {_short(w.last_error)}"
                )
        return Readiness(not reasons, tuple(reasons))


def _short(error: str | None, width: int = 160) -> str:
    text = " ".join((error or "unknown error").split())
    return text if len(text) <= width else text[: width - 1] + "…"
