"""What a claim-check reference looks like, and how one is made and checked.

A reference is the original event with every CloudEvents attribute as it was
(``id``, ``type``, ``source``, ``datacontenttype``, the extensions...),
*no data*, and three more extension attributes (carried as metadata keys, and
promoted to attributes of their own by :mod:`outrelay.core.model.cloudevents`):

``dataref``
    where the data is: ``file:///dir/KEY``, ``s3://bucket/prefix/KEY`` or
    ``outbox:payloads/KEY`` (the CloudEvents ``dataref`` extension);
``datarefsize``
    its length in bytes (decimal);
``datarefdigest``
    ``sha256:`` and the lower-case hex SHA-256 of those bytes.

``KEY`` is ``<event id>-<hex digest>`` (an event id that is not made of
letters, digits, ``.``, ``_`` and ``-`` is replaced by ``x`` and its own
SHA-256): the same bytes of the same event are stored once, however often
and to however many destinations they are sent.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from types import MappingProxyType

from outrelay.core.model._draft import copier
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError

__all__ = ["DATAREF", "DIGEST", "KEY_RE", "SIZE", "is_reference", "key_for", "reference", "restore"]

DATAREF = "dataref"
SIZE = "datarefsize"
DIGEST = "datarefdigest"
#: a key outrelay writes (retention deletes nothing else)
KEY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}-[0-9a-f]{64}$")

_SAFE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")
_with: Callable[[Event, bytes, MappingProxyType[str, str]], Event] = copier(Event, "data", "metadata")


def digest_of(data: bytes) -> str:
    """The lower-case hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def key_for(event_id: str, digest: str) -> str:
    """Where ``event_id``'s data with hex SHA-256 ``digest`` is stored, under a store's root."""
    safe = event_id if _SAFE_ID.match(event_id) else "x" + hashlib.sha256(event_id.encode()).hexdigest()[:40]
    return f"{safe}-{digest}"


def is_reference(event: Event) -> bool:
    """Whether ``event`` is a claim-check reference (it carries ``dataref``)."""
    return bool(event.metadata) and DATAREF in event.metadata


def reference(event: Event, location: str, size: int, digest: str) -> Event:
    """``event`` without its data, pointing at ``location`` (see the module docstring)."""
    meta = {**event.metadata, DATAREF: location, SIZE: str(size), DIGEST: f"sha256:{digest}"}
    return _with(event, b"", MappingProxyType(meta))


def restore(event: Event, data: bytes) -> Event:
    """The original event of reference ``event``, given the fetched ``data``.

    :raises EventError: ``data`` is not what the reference describes (size or
        digest differ), or the reference is malformed.
    """
    meta = dict(event.metadata)
    location = meta.pop(DATAREF, "?")
    size, digest = meta.pop(SIZE, None), meta.pop(DIGEST, "")
    m = _DIGEST_RE.match(digest)
    if m is None:
        raise EventError(f"claim-check reference {location}: datarefdigest {digest[:80]!r} is not sha256:<64 hex>")
    if size is not None and size != str(len(data)):
        raise EventError(f"claim-check payload {location}: {len(data)} bytes, the reference says {size[:20]}")
    if digest_of(data) != m.group(1):
        raise EventError(f"claim-check payload {location}: its SHA-256 differs from the reference's datarefdigest")
    return _with(event, data, MappingProxyType(meta))
