"""The CloudEvents mapping of the ``pulsar`` transport (binary mode): an Event to message properties and back.

The body is the event data, the properties are the CloudEvents attributes
with the ``ce_`` prefix plus ``content-type``, the partition key is the stream.
"""

from __future__ import annotations

from typing import Any

from outrelay.kit import Event, Received, binary_headers, from_binary

__all__ = ["decode", "properties"]


def properties(event: Event) -> dict[str, str]:
    """The message properties for ``event``: ``ce_*`` attributes plus ``content-type``."""
    props = binary_headers(event, prefix="ce_")
    if event.content_type:
        props["content-type"] = event.content_type
    return props


def decode(topic: str, msg: Any) -> Received:
    """The :class:`Received` of a ``pulsar.Message`` read from ``topic``.

    :raises EventError: the message is not an outrelay CloudEvent.
    """
    props = dict(msg.properties())
    data = bytes(msg.data())
    ctype = props.get("content-type")
    event = from_binary(props, data, content_type=ctype, prefix="ce_")
    return Received(event, topic, msg.partition_key() or None, props, data, ctype)
