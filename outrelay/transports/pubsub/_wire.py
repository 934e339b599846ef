"""Encoding of the ``pubsub`` transport (CloudEvents binary mode, as Google's Pub/Sub binding).

* data <-> message data (the event's bytes, untouched);
* every CloudEvents attribute <-> a ``ce-*`` attribute (the event id travels
  as ``ce-id``); ``datacontenttype`` <-> the ``content-type`` attribute.
"""

from __future__ import annotations

from typing import Any

from outrelay.kit import Event, Received, binary_headers, from_binary

__all__ = ["CONTENT_TYPE_ATTR", "PREFIX", "attributes", "decode"]

PREFIX = "ce-"
CONTENT_TYPE_ATTR = "content-type"


def attributes(event: Event) -> dict[str, str]:
    """The message attributes carrying ``event``'s CloudEvents attributes."""
    attrs = binary_headers(event, prefix=PREFIX)
    if event.content_type:
        attrs[CONTENT_TYPE_ATTR] = event.content_type
    return attrs


def decode(message: Any, topic: str) -> Received:
    """A pulled ``PubsubMessage`` of ``topic`` as :class:`Received` (key: its ordering key, or None).

    :raises outrelay.EventError: the attributes do not make a CloudEvent.
    """
    attrs = dict(message.attributes)
    data = bytes(message.data)
    ctype = attrs.get(CONTENT_TYPE_ATTR)
    event = from_binary(attrs, data, content_type=ctype, prefix=PREFIX)
    return Received(event, topic, message.ordering_key or None, attrs, data, ctype)
