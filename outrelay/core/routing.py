"""Routing: which destinations receive an event, and what happens on exhaustion.

A route matches when every non-empty filter matches: ``types`` and
``streams`` are globs (``fnmatch``, case-sensitive), ``tenants`` exact names,
``labels`` must all be present with equal values, ``tags`` must all be
present. With no routes configured, every event goes to every destination.

A destination that declares ``tenants`` (``DestinationConfig.tenants``) receives
only those tenants' events, whatever the routes say; the stores' static routing
(no decoding) is then off, since the decision depends on each event's tenant.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from fnmatch import fnmatchcase

from outrelay.core.config import RouteConfig
from outrelay.core.envelope import Event

__all__ = ["Router"]


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
        """Destination names for ``event``, each once, in config order."""
        if not self.routes:
            out = list(self.destinations)
        else:
            out = []
            for route in self.routes:
                if self.matches(route, event):
                    out.extend(d for d in route.destinations if d not in out)
        if self.tenants:
            tenant = event.tenant
            out = [d for d in out if (allowed := self.tenants.get(d)) is None or tenant in allowed]
        return out

    def parks(self, event: Event, destination: str) -> bool:
        """True when a matching route to ``destination`` says ``on_exhausted = "park"``."""
        return any(
            r.on_exhausted == "park" and destination in r.destinations and self.matches(r, event) for r in self.routes
        )
