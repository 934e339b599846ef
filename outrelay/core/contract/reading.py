"""The consuming side of the transport contract: what a :class:`Reader` returns.

A reader reads back what a transport published (the conformance suite and
``outrelay tail`` use it); the subscription contract
(:mod:`outrelay.core.contract.subscription`) hands the same :class:`Received` to the
subscriber runtime.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

from outrelay.core.model.envelope import Event

__all__ = ["Reader", "Received"]


@dataclasses.dataclass(frozen=True, slots=True)
class Received:
    """A message read back by a :class:`Reader`, decoded to an Event.

    ``headers`` holds the protocol's raw headers/attributes as strings,
    ``body`` the raw payload bytes, ``key`` the broker's ordering key.
    """

    event: Event
    target: str
    key: str | None
    headers: dict[str, str]
    body: bytes
    content_type: str | None = None


class Reader(ABC):
    """Consumer side of a transport: reads back what was published.

    Use as ``async with transport.reader(target) as r: await r.read(n, timeout)``.
    A reader only sees messages published after it was entered, unless the
    transport documents otherwise.
    """

    async def __aenter__(self) -> Reader:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @abstractmethod
    async def start(self) -> None:
        """Subscribe/attach; afterwards published messages are captured."""

    @abstractmethod
    async def read(self, count: int, timeout: float) -> list[Received]:
        """Return up to ``count`` messages, waiting at most ``timeout`` seconds."""

    @abstractmethod
    async def stop(self) -> None:
        """Detach and free resources; idempotent."""
