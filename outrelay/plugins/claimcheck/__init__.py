"""Claim-check for large events, configured per destination::

    [destinations.queue.claim_check]
    store = "s3://payloads-bucket/outrelay"   # or file:///var/lib/outrelay/payloads, or outbox
    threshold = 200_000                        # default: the transport's max_message_bytes
    retention_days = 14                        # default: keep for ever

What happens where:

* **relay**: through the ``outrelay_send_transform`` hook (after every other
  transform, so encrypted data is stored encrypted), each event of a batch
  whose data is larger than ``threshold`` bytes has its data stored once in
  the payload store and is sent as a *reference*: the same CloudEvents
  attributes, no data, and ``dataref``/``datarefsize``/``datarefdigest``
  (:mod:`outrelay.plugins.claimcheck._reference`). A store that cannot be
  written fails the batch retryably (backoff, then the route's exhaustion
  policy); no reference is sent before its payload is durable. With
  ``retention_days`` the relay deletes payloads stored longer ago, at start
  and every :data:`RETENTION_INTERVAL` seconds.
* **subscribers**: after :meth:`Resolver.install` (``EventBus.from_config``
  does it when a destination of the config has a ``claim_check`` table),
  subscriptions started in this process fetch each reference's data before
  decryption, upcasting and the handler, and check its size and SHA-256.
  A reference outside the installed stores, a payload that is gone or one
  whose digest differs is dead-lettered at once with the reason; a store
  that cannot be read now leaves the event unacknowledged and its stream
  waits, retrying every second.
* **consumers that are not outrelay** read the three attributes and fetch
  the bytes themselves: docs/claim-check.md shows how.

Several destinations may share one store; each payload key is the event id
plus the data's digest, so the same bytes of one event are stored once.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any
from urllib.parse import unquote

from outrelay.core.config.config import ClaimCheckConfig, OutrelayConfig
from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.contract.segments import RejectedTarget
from outrelay.core.contract.transport import Message, Transport
from outrelay.core.model._draft import copier
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError, EventError, RetryableError
from outrelay.plugins.claimcheck._reference import (
    DATAREF,
    DIGEST,
    SIZE,
    digest_of,
    is_reference,
    key_for,
    reference,
    restore,
)
from outrelay.plugins.claimcheck._s3 import S3Store
from outrelay.plugins.claimcheck._stores import DirectoryStore, OutboxStore, PayloadStore

__all__ = [
    "DATAREF",
    "DIGEST",
    "RETENTION_INTERVAL",
    "SIZE",
    "DirectoryStore",
    "OutboxStore",
    "PayloadStore",
    "Resolver",
    "S3Store",
    "installed",
    "is_reference",
    "open_store",
    "uninstall",
]

log = logging.getLogger("outrelay.relay")

#: seconds between two retention rounds of a payload store (the first runs when the relay starts)
RETENTION_INTERVAL = 3600.0

_with_event: Callable[[Message, Event], Message] = copier(Message, "event")


def open_store(config: ClaimCheckConfig, outbox_url: str) -> PayloadStore:
    """The payload store a ``claim_check`` table names (no I/O yet).

    :raises ConfigError: ``store = "outbox"`` with an outbox other than SQLite or PostgreSQL.
    """
    if config.store == "outbox":
        return OutboxStore(outbox_url)
    if config.store.startswith("file://"):
        return DirectoryStore(unquote(config.store[len("file://") :]))
    return S3Store(config.store, endpoint_url=config.endpoint_url, region=config.region)


# -- the relay's side ---------------------------------------------------------------------------


def checker(store: PayloadStore, threshold: int) -> Callable[[list[Message]], Awaitable[list[Message]]]:
    """The relay's per-batch transform: events over ``threshold`` bytes become references to ``store``.

    :raises RetryableError: (from the transform) the store cannot be written; the batch is retried.
    """

    def stash(events: list[Event]) -> list[Event]:
        refs = []
        for e in events:
            digest = digest_of(e.data)
            key = key_for(e.id, digest)
            store.put(key, e.data)
            refs.append(reference(e, store.location(key), len(e.data), digest))
        return refs

    async def transform(messages: list[Message]) -> list[Message]:
        big = [  # a message already refused (its target could not be rendered) is not worth storing
            i
            for i, m in enumerate(messages)
            if len(m.event.data) > threshold and not is_reference(m.event) and not isinstance(m.target, RejectedTarget)
        ]
        if not big:
            return messages
        refs = await asyncio.to_thread(stash, [messages[i].event for i in big])
        out = list(messages)
        for i, ref in zip(big, refs, strict=True):
            out[i] = _with_event(out[i], ref)
        return out

    return transform


@hookimpl(trylast=True)  # last: the payload is stored as the other transforms left it (encrypted)
def outrelay_send_transform(
    config: OutrelayConfig, destination: str, transport: Transport | None = None
) -> Callable[[list[Message]], Awaitable[list[Message]]] | None:
    dest = config.destinations.get(destination)
    if dest is None or dest.claim_check is None:
        return None
    threshold = dest.claim_check.threshold
    if threshold is None and transport is not None:
        threshold = transport.capabilities.max_message_bytes
    if threshold is None:
        raise ConfigError(
            f"destinations.{destination}.claim_check: set threshold (bytes): transport {dest.transport!r} "
            "declares no largest message size"
        )
    return checker(open_store(dest.claim_check, config.outbox.url), threshold)


# -- retention ----------------------------------------------------------------------------------

_retention: dict[int, list[asyncio.Task[None]]] = {}


async def _prune_loop(store: PayloadStore, days: float) -> None:
    while True:
        try:
            removed = await asyncio.to_thread(store.prune, time.time() - days * 86400)
        except RetryableError as exc:  # the next round tries again; delivery does not depend on it
            log.warning("claim-check retention: %s; retrying in %.0fs", exc, RETENTION_INTERVAL)
        else:
            if removed:
                log.info(
                    "claim-check retention: removed %d payload(s) older than %g days from %r", removed, days, store
                )
        await asyncio.sleep(RETENTION_INTERVAL)


@hookimpl
def outrelay_relay_started(relay: Any) -> None:
    config: OutrelayConfig = relay.config
    longest: dict[str, tuple[PayloadStore, float]] = {}  # a store shared by destinations keeps the longest
    for dest in config.destinations.values():
        cc = dest.claim_check
        if cc is None or cc.retention_days is None:
            continue
        store = open_store(cc, config.outbox.url)
        where = store.location("")
        if where not in longest or longest[where][1] < cc.retention_days:
            longest[where] = (store, cc.retention_days)
    if longest:
        loop = asyncio.get_running_loop()
        _retention[id(relay)] = [loop.create_task(_prune_loop(s, d)) for s, d in longest.values()]


@hookimpl
def outrelay_relay_stopped(relay: Any) -> None:
    for task in _retention.pop(id(relay), []):
        task.cancel()


# -- the subscribers' side ----------------------------------------------------------------------


class Resolver:
    """Fetches references' data from the payload stores it knows (and nowhere else)."""

    def __init__(self, stores: Iterable[PayloadStore]) -> None:
        self.stores = list(stores)

    @classmethod
    def from_config(cls, config: OutrelayConfig) -> Resolver:
        """The stores of every ``claim_check`` table of ``config``."""
        seen: dict[str, PayloadStore] = {}
        for dest in config.destinations.values():
            if dest.claim_check is not None:
                store = open_store(dest.claim_check, config.outbox.url)
                seen.setdefault(store.location(""), store)
        return cls(seen.values())

    def fetch(self, event: Event) -> Event:
        """The original of reference ``event`` (any other event as it is). Blocking: the
        subscriber runtime calls it in a worker thread; a plain script may call it directly.

        :raises EventError: a location outside these stores, a payload that is gone, or one
            whose size or digest differs from the reference's.
        :raises RetryableError: the store cannot be read now.
        """
        if not is_reference(event):
            return event
        location = event.metadata[DATAREF]
        for store in self.stores:
            if store.owns(location):
                return restore(event, store.get(location))
        raise EventError(
            f"claim-check reference {location[:200]!r} is not in a payload store this process reads "
            f"({', '.join(repr(s) for s in self.stores) or 'none installed'})"
        )

    async def resolve(self, event: Event) -> Event:
        """:meth:`fetch` in a worker thread (what subscriptions apply to each received event)."""
        if not is_reference(event):
            return event
        return await asyncio.to_thread(self.fetch, event)

    def install(self) -> None:
        """Make subscriptions started from now on in this process resolve references with these stores."""
        global _installed
        _installed = self

    def __repr__(self) -> str:
        return f"<Resolver {self.stores!r}>"


_installed: Resolver | None = None


def installed() -> Resolver | None:
    """The resolver this process's subscriptions use (see :meth:`Resolver.install`)."""
    return _installed


def uninstall() -> None:
    """Subscriptions started from now on hand references to handlers as they arrive."""
    global _installed
    _installed = None


@hookimpl(tryfirst=True)  # first: the fetched data is then decrypted and upcast
def outrelay_receive_transform(consumer: str) -> Callable[[Event], Awaitable[Event]] | None:
    resolver = _installed
    return None if resolver is None else resolver.resolve


@hookimpl
def outrelay_bus_configured(config: OutrelayConfig) -> None:
    if any(d.claim_check is not None for d in config.destinations.values()):
        Resolver.from_config(config).install()
