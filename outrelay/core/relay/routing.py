"""Routing: which destinations receive an event, and what happens on exhaustion.

A route matches when every non-empty filter matches: ``types`` and
``streams`` are globs (``fnmatch``, case-sensitive), ``tenants`` exact names,
``labels`` must all be present with equal values, ``tags`` must all be
present. With no routes configured, every event goes to every destination.

A destination that declares ``tenants`` (``DestinationConfig.tenants``) receives
only those tenants' events, whatever the routes say; the stores' static routing
(no decoding) is then off, since the decision depends on each event's tenant.

An event for which the router finds no destination is *unrouted*: it is
delivered nowhere. The router counts such events per reason and type
(:data:`UNROUTED_REASONS`); :meth:`Router.take_unrouted` hands the counts to
the relay, which logs and records them (:mod:`outrelay.core.relay.unrouted`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase

from outrelay.core.config.config import RouteConfig
from outrelay.core.model.envelope import Event

__all__ = ["UNROUTED_REASONS", "Router"]

#: why an event went nowhere, by the reason's key (a label of ``outrelay_unrouted_events_total``)
UNROUTED_REASONS = {
    "no_route": "no [[routes]] entry matches it",
    "tenant": "every destination its routes name serves other tenants only (destinations.NAME.tenants)",
}


class Router:
    """Evaluates routes against events; pure and cheap, called per event."""

    def __init__(
        self,
        routes: Sequence[RouteConfig],
        destinations: Iterable[str],
        tenants: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        """``tenants`` maps a destination to the only tenants it may receive."""
        self.routes = tuple(routes)
        self.destinations = tuple(destinations)
        self.tenants: dict[str, frozenset[str]] = {d: frozenset(t) for d, t in (tenants or {}).items() if t}
        #: with no routes (and no tenant-restricted destination) every event goes everywhere;
        #: stores may then skip decoding events
        static = not self.routes and not self.tenants
        self.static_destinations: tuple[str, ...] | None = self.destinations if static else None
        # (reason, type) -> unrouted events since the last take_unrouted(); the stores call the
        # router from a worker thread while the relay's loop takes the counts
        self._unrouted: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> list[str]:
        return self.destinations_for(event)

    @staticmethod
    def matches(route: RouteConfig, event: Event) -> bool:
        if route.types and not any(fnmatchcase(event.type, p) for p in route.types):
            return False
        if route.tenants and event.tenant not in route.tenants:
            return False
        if route.streams and not any(fnmatchcase(event.stream, p) for p in route.streams):
            return False
        if any(event.labels.get(k) != v for k, v in route.labels.items()):
            return False
        return all(t in event.tags for t in route.tags)

    def destinations_for(self, event: Event) -> list[str]:
        """Destination names for ``event``, each once, in config order (empty: the event is
        unrouted, and counted)."""
        if not self.routes:
            out = list(self.destinations)
        else:
            out = []
            for route in self.routes:
                if self.matches(route, event):
                    out.extend(d for d in route.destinations if d not in out)
        if not out:
            self._count_unrouted("no_route", event.type)
        elif self.tenants:
            tenant = event.tenant
            out = [d for d in out if (allowed := self.tenants.get(d)) is None or tenant in allowed]
            if not out:
                self._count_unrouted("tenant", event.type)
        return out

    def _count_unrouted(self, reason: str, type_: str) -> None:
        with self._lock:
            self._unrouted[(reason, type_)] += 1

    def take_unrouted(self) -> dict[tuple[str, str], int]:
        """The unrouted events counted since the last call, by ``(reason, type)``; resets them.
        (A routing transaction that failed and ran again counts its unrouted events twice.)"""
        with self._lock:
            taken = dict(self._unrouted)
            self._unrouted.clear()
        return taken

    def parks(self, event: Event, destination: str) -> bool:
        """True when a matching route to ``destination`` says ``on_exhausted = "park"``."""
        return any(
            r.on_exhausted == "park" and destination in r.destinations and self.matches(r, event) for r in self.routes
        )
