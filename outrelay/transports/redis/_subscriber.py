"""Subscriptions of the ``redis`` transport: Redis Streams consumer groups and fan-out.

The target is one stream key: ``spec.target``, or the destination's
``stream`` when that is a fixed key (a template such as ``events:{category}``
renders many keys, and Redis cannot consume a key pattern:
:class:`~outrelay.PermanentError` from ``RedisTransport.subscription``, which picks
the backend). Every member opens its own connection.

**Group** (:class:`~._group.RedisGroup`): ``XGROUP CREATE key group $ MKSTREAM``
(``0`` with ``from_beginning``; an existing group — ``BUSYGROUP`` — resumes
where it was) before ``start`` returns, so the position is the group's and
survives every member. Members read with ``XREADGROUP`` and ack with
``XACK``. Redis hands consecutive entries of one stream to different
members, so a per-stream gate restores cross-member order (guarantee #2):
one Redis list per (key, group, event stream) holds the group's unacked
entry ids in order, pushed by the same Lua script that runs the
``XREADGROUP`` and emptied by the script that runs the ``XACK``. A member
hands an entry to the runtime only when every id below it in its list is
one it handed over itself; until then it holds it (it counts against
``prefetch``) and polls the list every 10 ms. Details: :mod:`._gate`.
Cost of the gate: entries of a stream that another member is busy with
wait in this member's prefetch, so one slow (or parked) stream with heavy
traffic can fill every member's prefetch and slow the other streams down.

A live member re-claims the entries it holds (``XCLAIM ... JUSTID``, only
those it still owns) every ``claim_timeout / 3``, so they never look idle.
Members run ``XAUTOCLAIM`` with ``min-idle = claim_timeout`` about once a
second (at most every ``claim_timeout / 3``): a crashed member's entries
move to a survivor within about ``claim_timeout`` and, being already in the
gate lists, keep their place in their streams. A member claims even when
its prefetch is full (at most 16 entries beyond it), since the entries that
block its held ones may be exactly a dead member's. ``stop`` sets the idle time
of its unacked entries to a huge value (``XCLAIM ... IDLE``), so a survivor
takes them on its next ``XAUTOCLAIM``, and deletes its consumer only if it
has nothing pending. An entry trimmed (``MAXLEN``) or deleted while pending
is dropped from its gate list after it blocked a member for
``claim_timeout``. Acks that arrive together go out in one script call.
A member paused longer than ``claim_timeout`` (so that its entries were
claimed) may see an event handled twice, and then out of order: at least
once is kept, order only while members keep up.

**Fan-out** (:class:`RedisFanout`): ``start`` reads the stream's last entry
id (``XREVRANGE key + - COUNT 1``; ``0-0`` for an empty stream or with
``from_beginning``) and ``receive`` runs ``XREAD BLOCK`` from there, so an
entry appended right after ``start`` returned is seen. Nothing is kept for
a fan-out subscriber; ``ack`` does nothing.

A ``receive`` still running when ``stop`` is called returns nothing (a group
member's ends at its next step; what it read meanwhile is claimed by others),
like a ``receive`` after ``stop``.

An entry that is not an outrelay CloudEvent comes back as an
:class:`~outrelay.core.contract.subscription.Inbound` with ``received=None`` and the
reason; in a group it must still be acked.

:raises RetryableError: broker unreachable or connection lost (``start``,
    ``receive``, ``ack``); the next call opens a new connection.
:raises PermanentError: authentication or ACL refusal, a key that is not a
    stream, a templated ``stream`` without ``spec.target``.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from outrelay.kit import Inbound, SubscriptionBackend, SubscriptionSpec, TransportError, UsageError
from outrelay.transports.redis._client import Client, open_client
from outrelay.transports.redis._config import RedisConfig
from outrelay.transports.redis._errors import map_redis_errors
from outrelay.transports.redis._gate import ordering_key
from outrelay.transports.redis._wire import decode

__all__ = ["RedisFanout", "RedisSubscriber", "text", "to_inbound"]


def text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def to_inbound(key: str, entry_id: str, fields: Any, **kw: Any) -> Inbound:
    """Decode one entry; a foreign one becomes ``Inbound(received=None, error=...)``
    whose ``stream`` is the entry's ordering key if it has one (else ``""``)."""
    try:
        received = decode(key, fields)
    except Exception as exc:  # any decoding failure means "not an outrelay CloudEvent", never an exception
        reason = (str(exc).split("\n", 1)[0] or type(exc).__name__)[:200]
        error = f"entry {entry_id} of {key!r} is not an outrelay CloudEvent: {reason}"
        return Inbound(None, ordering_key(fields), error=error, broker_id=entry_id, **kw)
    return Inbound(received, received.event.stream, broker_id=entry_id, **kw)


class RedisSubscriber(SubscriptionBackend):
    """What both backends share: the key, one client per member, the error boundary."""

    def __init__(self, cfg: RedisConfig, spec: SubscriptionSpec, key: str, *, destination: str) -> None:
        super().__init__(spec)
        self.cfg = cfg
        self.key = key
        self.destination = destination
        self._client: Client | None = None
        self._stopped = False
        # a BLOCK at or above socket_timeout would end in a client-side timeout
        self._max_block = max(0.001, cfg.socket_timeout * 0.8)

    def _errors(self, what: str) -> Any:
        return map_redis_errors(f"{what} on {self.key!r} at {self.cfg.url}", self.destination)

    @contextlib.asynccontextmanager
    async def _receiving(self, client: Client, what: str) -> AsyncIterator[None]:
        """Around a receive on ``client``: its errors mapped (:meth:`_errors`), unless :meth:`stop` ran
        meanwhile: then the error (the closed connection's) is swallowed — the caller then returns nothing,
        as a receive after stop does — and the client is closed again, since a command the receive started
        after stop would have opened a new connection that nobody else closes."""
        try:
            with self._errors(what):
                yield
        except TransportError:
            if self._client is client:
                raise
        finally:
            if self._client is not client:
                with contextlib.suppress(Exception):
                    await client.aclose()

    def _live(self) -> Client | None:
        """The client; None once stopped. :raises UsageError: before ``start``."""
        if self._client is None and not self._stopped:
            raise UsageError(f"{self!r} is not started: call start() first")
        return self._client

    async def _open(self) -> Client:
        """A connected client. :raises PermanentError: the server is not in the configured mode."""
        client, _ = await open_client(self.cfg, self.destination)
        return client


class RedisFanout(RedisSubscriber):
    """Fan-out: ``XREAD`` from the last entry id resolved at ``start``."""

    _last = "0-0"

    async def start(self) -> None:
        if self._client is not None:
            return
        client = await self._open()
        try:
            with self._errors("XREVRANGE"):
                top = [] if self.spec.from_beginning else await client.xrevrange(self.key, "+", "-", count=1)
        except BaseException:
            await client.aclose()
            raise
        self._last = text(top[0][0]) if top else "0-0"
        self._client, self._stopped = client, False

    async def receive(self, max_messages: int, timeout: float) -> list[Inbound]:
        client = self._live()
        if client is None or max_messages <= 0:
            return []
        block = None if timeout <= 0 else max(1, int(min(timeout, self._max_block) * 1000))
        reply: Any = None
        async with self._receiving(client, "XREAD"):
            reply = await client.xread({self.key: self._last}, count=max_messages, block=block)
        out: list[Inbound] = []
        for _key, entries in reply or ():
            for raw_id, fields in entries:
                entry_id = text(raw_id)
                out.append(to_inbound(self.key, entry_id, fields))
                self._last = entry_id
        return out

    async def stop(self) -> None:
        client, self._client = self._client, None
        self._stopped = True
        if client is not None:
            await client.aclose()
