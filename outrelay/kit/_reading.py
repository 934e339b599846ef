"""Helpers for the consuming side of a transport: a bounded read loop, an Event from a record, a Received.

Every reader repeats the same pieces: poll the broker in short slices
until ``count`` messages arrived or ``timeout`` passed (:func:`read_until`),
turn a record that may carry either CloudEvents mode back into the
:class:`~outrelay.kit.Event` (:func:`event_from_record`), and build the
:class:`~outrelay.kit.Received` (:func:`received`, for per-record hot paths).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TypeVar

from outrelay.core.contract.reading import Received
from outrelay.core.model._draft import builder
from outrelay.core.model.cloudevents import from_attributes, from_structured, is_structured
from outrelay.core.model.envelope import Event

__all__ = ["event_from_record", "read_until", "received"]

T = TypeVar("T")


async def read_until(
    count: int,
    timeout: float,
    poll: Callable[[int, float], Awaitable[Iterable[T]]],
    *,
    step: float | None = None,
) -> list[T]:
    """Collect what ``poll(room, seconds)`` returns until ``count`` items arrived or ``timeout`` seconds passed.

    ``poll`` is given how many items are still wanted and how long it may wait for the first
    (always > 0, never past the deadline, at most ``step`` seconds when given: a client that polls
    in short slices); it returns what it got, possibly nothing (then it is polled again while time
    is left). A poll that returns more than ``room`` items has them all kept. ``timeout <= 0``
    polls not at all. :class:`TimeoutError` from ``poll`` ends the read with what was read; any
    other exception ends it with what was read when something was (it is expected to repeat on
    the next read) and propagates otherwise (map it with the transport's ``ErrorMap``).
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    out: list[T] = []
    while len(out) < count and (left := deadline - loop.time()) > 0:
        try:
            got = await poll(count - len(out), left if step is None else min(left, step))
        except TimeoutError:
            break
        except Exception:
            if out:
                break
            raise
        out.extend(got)
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


_FIELDS = ("event", "target", "key", "headers", "body", "content_type")
if tuple(f.name for f in dataclasses.fields(Received)) != _FIELDS:  # pragma: no cover - Received changed
    raise ImportError(f"outrelay.kit.received fills Received's fields {_FIELDS}; Received changed: update it")
_build = builder(Received)


def received(
    event: Event, target: str, key: str | None, headers: dict[str, str], body: bytes, content_type: str | None = None
) -> Received:
    """``Received(event, target, key, headers, body, content_type)``, at about half the cost.

    For a consumer's per-record path: a frozen dataclass's ``__init__`` sets each field through
    ``object.__setattr__``, which costs as much again as decoding the headers. The fields are
    filled by a generated builder (:func:`outrelay.core.model._draft.builder`; the field order is checked
    against :class:`Received` at import), so a transport never reaches into the layout itself.
    Nothing is validated, as with the constructor.
    """
    return _build(event, target, key, headers, body, content_type)
