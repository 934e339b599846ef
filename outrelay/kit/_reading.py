"""Helpers for the consuming side of a transport: a bounded read loop, and an Event from a record.

Every reader repeats the same two pieces: poll the broker in short slices
until ``count`` messages arrived or ``timeout`` passed (:func:`read_until`),
and turn a record that may carry either CloudEvents mode back into the
:class:`~outrelay.kit.Event` (:func:`event_from_record`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

from outrelay.core.cloudevents import from_attributes, from_structured, is_structured
from outrelay.core.envelope import Event

__all__ = ["event_from_record", "read_until"]

T = TypeVar("T")


async def read_until(
    count: int, timeout: float, poll: Callable[[int, float], Awaitable[Iterable[T]]], *, step: float = 0.5
) -> list[T]:
    """Collect what ``poll(room, seconds)`` returns until ``count`` items arrived or ``timeout`` seconds passed.

    ``poll`` is given how many items are still wanted and how long it may wait (at most ``step``
    seconds, and never past the deadline); it returns what it got, possibly nothing. A poll that
    returns more than ``room`` items has them all kept. ``timeout <= 0`` polls not at all.
    Exceptions of ``poll`` propagate (map them with the transport's ``ErrorMap`` around the call).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: list[T] = []
    while len(out) < count and (left := deadline - loop.time()) > 0:
        out.extend(await poll(count - len(out), min(left, step)))
    return out


def event_from_record(attributes: Mapping[str, str], body: bytes, content_type: str | None) -> Event:
    """The Event of a received record in either CloudEvents mode.

    Structured mode when ``content_type`` says so (the JSON CloudEvent is ``body``); else binary
    mode: ``attributes`` are the CloudEvents attributes without the protocol's prefix, ``body`` is
    the data and ``content_type`` its ``datacontenttype`` unless ``attributes`` names one.

    :raises EventError: the record is not an outrelay CloudEvent.
    """
    if is_structured(content_type):
        return from_structured(body)
    if content_type and "datacontenttype" not in attributes:
        attributes = {**attributes, "datacontenttype": content_type}
    return from_attributes(attributes, body)
