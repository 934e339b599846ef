"""Who routes new appends, where the store routes and claims in one transaction.

A store with ``route_and_claim`` (SQLite; PostgreSQL without the audit chain) lets the
next destination to claim route the appends waiting for it: one hop less between the
commit and the send than the router's own round. :class:`RoutingHandoff` keeps the
bookkeeping of that hand-off for one relay: appends are waiting (``appended``), one
routing at a time (``take`` / ``done``), an idle destination woken to route them, and,
should none claim within ``delay`` seconds (plus ``linger``, below; every destination
paused, or stuck on a slow send), the router woken to route them itself.

Under steady load (a routing began less than ``linger`` seconds ago and did not find a
backlog) the next routing waits for the rest of ``linger`` (:meth:`RoutingHandoff.hold`),
so one store round routes, claims and settles the appends of a few milliseconds together
instead of one each; at a trickle (appends further apart than ``linger``) nothing waits.

It runs on the relay's event loop; nothing in it is thread-safe.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from typing import Protocol

__all__ = ["HANDOFF_DELAY", "RoutingHandoff", "Wakeable"]

#: seconds appends wait for a destination's claim to route them before the router does
HANDOFF_DELAY = 0.02


class Wakeable(Protocol):
    """A destination as the hand-off sees it: waiting for work (``idle``), and its wake-up."""

    idle: bool
    wake: asyncio.Event


class RoutingHandoff:
    """See the module docstring. ``destinations`` gives the destinations to wake (read at each
    wake-up); ``wake_router`` wakes the router."""

    def __init__(
        self,
        destinations: Callable[[], Iterable[Wakeable]],
        wake_router: Callable[[], None],
        delay: float = HANDOFF_DELAY,
        linger: float = 0.0,
    ) -> None:
        self._destinations = destinations
        self._wake_router = wake_router
        self._delay = delay
        self._linger = linger
        self._taken_at = float("-inf")  # when the last routing by a destination's claim began (time.monotonic)
        self._backlog = False  # the last routing found a full batch: the next one must not wait
        self._unrouted = False  # appends committed since the last routing began
        self._routing = 0  # routings in progress (at most one)
        self._timer: asyncio.TimerHandle | None = None

    def appended(self) -> None:
        """Committed appends are waiting: an idle destination is woken to route them in its
        claim, and the router after ``delay`` seconds should none have taken them."""
        self._unrouted = True
        self._wake_idle()
        if self._timer is None:
            # after a destination's linger (hold) too: the router must not route what a holding claim waits for
            self._timer = asyncio.get_running_loop().call_later(self._delay + self._linger, self._expired)

    def take(self, *, router: bool = False) -> bool:
        """For a destination about to claim: True when it should route first (appends are waiting);
        for the router (``router``): True unless a routing is under way, whether appends wait or not
        (its poll, a full batch's remainder, a pending commit). The caller then calls :meth:`done`
        once its routing returned or failed.

        At most one routing runs at a time: PostgreSQL serialises routing with a lock that the
        others would fail to take and then skip, while the one holding it may already have passed
        the newest appends; so they wait for it and it routes them next."""
        if self._routing or not (router or self._unrouted):
            return False
        self._unrouted = False
        self._routing += 1
        if not router:  # the router's rounds (polls) say nothing about the rate of appends
            self._taken_at = time.monotonic()
        if self._timer is not None:  # this routing takes the waiting appends: no wake-up for them later
            self._timer.cancel()
            self._timer = None
        return True

    def done(self, *, backlog: bool = False) -> None:
        """The routing :meth:`take` began has ended (``backlog``: it routed or claimed a full
        batch, so more is waiting); appends that came in meanwhile go to the next claim (an idle
        destination is woken for it)."""
        self._routing -= 1
        self._backlog = backlog
        if self._unrouted:
            self._wake_idle()

    def hold(self) -> float:
        """Seconds a destination about to route the waiting appends should wait first (0 or less:
        none): the rest of ``linger`` after the last routing began, unless that one found a
        backlog. Appends committed meanwhile are routed by the same store round."""
        if self._backlog:
            return 0.0
        return self._taken_at + self._linger - time.monotonic()

    @property
    def waits(self) -> bool:
        """Committed appends wait for a claim that routes them (a destination should not go to sleep)."""
        return self._unrouted and not self._routing

    def close(self) -> None:
        """Cancel a pending wake-up of the router (the relay stops)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _wake_idle(self) -> None:
        if self._routing:  # whoever routes now takes the new appends next (see take)
            return
        for d in self._destinations():
            if d.idle:
                d.wake.set()
                return

    def _expired(self) -> None:
        self._timer = None
        if self._unrouted:
            self._wake_router()
