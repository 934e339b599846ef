"""The application-facing outbox: ``Outbox.open(url)`` and ``append``.

``append`` writes only to the database (invariant 1). Given ``conn``, it
runs inside the caller's open transaction and the caller commits; without
it, it commits a transaction of its own. Relays in the same process are
woken at once; others are woken by the store (PostgreSQL LISTEN, a SQLite
commit watcher) or poll.

Events whose data exceeds ``max_event_bytes`` (default
:data:`DEFAULT_MAX_EVENT_BYTES`, 8 MiB) are refused before anything is
written: most brokers refuse far less (Kafka and NATS 1 MB, SQS 256 KiB,
Pub/Sub 10 MB), so a larger event would only be dead-lettered later, and
every event the relay holds costs its size in memory. Raise it with
``Outbox.open(url, max_event_bytes=...)`` or ``[outbox] max_event_bytes``
(``None``: no limit) when a destination takes more.

With tracing on (:mod:`outrelay.core.model.tracecontext`), events appended while a
span is current are stored with its W3C trace context (metadata
``traceparent``/``tracestate``) unless they carry one already.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable
from typing import Any

from outrelay.core.model import tracecontext
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError, EventError
from outrelay.core.stores.base import Store

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "Outbox", "open_store"]

#: the default largest event data ``append`` accepts (see the module docstring)
DEFAULT_MAX_EVENT_BYTES = 8 * 1024 * 1024


def open_store(url: str, **options: Any) -> Store:
    """Open the store for ``url`` by its scheme (plugins may add schemes).

    :raises ConfigError: unknown scheme. :raises StoreError: cannot open.
    """
    scheme = url.split(":", 1)[0].split("+", 1)[0].lower()
    if scheme == "sqlite":
        from outrelay.core.stores.sqlite import SQLiteStore

        return SQLiteStore(url, **options)
    from outrelay.core.config.registry import get_registry

    target = get_registry().stores.get(scheme)
    if target is None:
        raise ConfigError(
            f"outbox url {url.split('@')[-1]!r}: unknown scheme {scheme!r}; use sqlite:///FILE or postgresql://..."
        )
    mod_name, _, attr = target.partition(":")
    try:
        cls = getattr(importlib.import_module(mod_name), attr)
    except ImportError as exc:
        raise ConfigError(
            f'the {scheme} outbox needs an extra that is not installed ({exc.name}): pip install "outrelay[postgres]"'
        ) from None
    store: Store = cls(url, **options)
    return store


class Outbox:
    """An outbox database. Thread-safe; use one per process and database."""

    def __init__(
        self,
        store: Store,
        *,
        max_event_bytes: int | None = DEFAULT_MAX_EVENT_BYTES,
        encode: Callable[[list[Event]], list[Event]] | None = None,
    ) -> None:
        self.store = store
        self.max_event_bytes = max_event_bytes
        #: applied to each batch after validation, before storing (at-rest encryption, ``outrelay[crypto]``)
        self.encode = encode
        tracecontext.enable_from_env()  # $OUTRELAY_TRACING (see outrelay.core.model.tracecontext)
        self._listeners: list[Callable[[bool], None]] = []
        self._lock = threading.Lock()

    @classmethod
    def open(
        cls,
        url: str,
        *,
        max_event_bytes: int | None = DEFAULT_MAX_EVENT_BYTES,
        encode: Callable[[list[Event]], list[Event]] | None = None,
        **options: Any,
    ) -> Outbox:
        """Open (creating or migrating the schema) ``sqlite:///FILE`` or ``postgresql://...``.

        ``max_event_bytes``: the largest event data :meth:`append` accepts (None: any).
        ``encode``: turns each appended batch into what is stored, same ids, same
        order (``PayloadCrypto.outbox_encoder`` seals data at rest)."""
        return cls(open_store(url, **options), max_event_bytes=max_event_bytes, encode=encode)

    @property
    def url(self) -> str:
        return self.store.url

    def append(self, events: Event | Iterable[Event], conn: Any = None) -> list[str]:
        """Append one event or several, atomically; returns their ids.

        :raises EventError: not an Event, data over ``max_event_bytes``, or an id
            already in the outbox (nothing was appended).
        :raises StoreError: the database failed (nothing was appended).
        """
        batch = self._check(events, "append")
        if not batch:
            return []
        stored = self.store.append(batch, conn)
        self._notify(conn is not None)
        return [e.id for e in stored]

    async def aappend(self, events: Event | Iterable[Event], conn: Any = None) -> list[str]:
        """:meth:`append` for asyncio code. ``conn`` is an async connection in
        an open transaction (PostgreSQL: ``psycopg.AsyncConnection`` or a
        SQLAlchemy ``AsyncSession``/``AsyncConnection``; the caller commits);
        without it the events are committed from a worker thread.

        :raises EventError: not an Event, or an id already in the outbox.
        :raises StoreError: the database failed, or ``conn`` is not supported.
        """
        batch = self._check(events, "aappend")
        if not batch:
            return []
        stored = await self.store.aappend(batch, conn)
        self._notify(conn is not None)
        return [e.id for e in stored]

    def _check(self, events: Event | Iterable[Event], what: str) -> list[Event]:
        batch = [events] if isinstance(events, Event) else list(events)
        limit = self.max_event_bytes
        for e in batch:
            if not isinstance(e, Event):
                raise EventError(f"{what}() takes outrelay.Event objects, got {type(e).__name__}")
            if limit is not None and len(e.data) > limit:
                raise EventError(
                    f"event {e.id} ({e.type}): data is {len(e.data):,} bytes, over the outbox's max_event_bytes "
                    f"{limit:,}; nothing was appended. Store large payloads elsewhere and append a reference, "
                    "or raise the limit: Outbox.open(url, max_event_bytes=N) / [outbox] max_event_bytes"
                )
        # the only cost of tracing while it is off: one module attribute read per append
        batch = tracecontext.stamp(batch) if tracecontext.active else batch
        return batch if self.encode is None else self.encode(batch)

    def add_listener(self, callback: Callable[[bool], None]) -> Callable[[], None]:
        """Call ``callback(in_caller_txn)`` after each append; returns an unsubscribe."""
        with self._lock:
            self._listeners.append(callback)

        def remove() -> None:
            with self._lock:
                if callback in self._listeners:
                    self._listeners.remove(callback)

        return remove

    def _notify(self, pending_commit: bool) -> None:
        for cb in list(self._listeners):
            cb(pending_commit)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Outbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Outbox {self.store!r}>"
