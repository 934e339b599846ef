"""The CloudEvents Kafka binding of the ``kafka`` transport: an Event to a record and back.

Binary mode (default) puts the attributes in ``ce_*`` headers plus a
``content-type`` header and the data verbatim in the value; structured mode
puts the JSON CloudEvent in the value with ``content-type:
application/cloudevents+json``. The record key is the event's stream.
"""

from __future__ import annotations

from typing import Any

from outrelay.kit import (
    STRUCTURED_CONTENT_TYPE,
    Event,
    Received,
    attribute_names,
    binary_headers,
    event_from_record,
    received,
    to_structured,
)

__all__ = ["decode", "encode"]

_KNOWN = attribute_names("ce_")


def encode(event: Event, mode: str) -> tuple[bytes, list[tuple[str, bytes]]]:
    """The record value and headers of ``event`` in binary or structured mode."""
    if mode == "structured":
        return to_structured(event), [("content-type", STRUCTURED_CONTENT_TYPE.encode())]
    headers = [(k, v.encode()) for k, v in binary_headers(event, "ce_").items()]
    if event.content_type:
        headers.append(("content-type", event.content_type.encode()))
    return event.data, headers


def decode(topic: str, key: bytes | None, value: bytes | None, headers: Any) -> Received:
    """Rebuild a :class:`Received` from a raw record (binary or structured mode).

    ``headers`` of the result holds every record header (values decoded as
    UTF-8, invalid bytes replaced), ``body`` the raw value.

    :raises EventError: the record is not an outrelay CloudEvent.
    :raises UnicodeDecodeError: the record key is not UTF-8.
    """
    known = _KNOWN
    hdrs: dict[str, str] = {}
    attrs: dict[str, str] = {}
    for k, v in headers or ():  # one pass: values decoded, attributes collected
        try:
            text = v.decode() if v else ""  # strict UTF-8 (the fast call); where it fails, what "replace" gives
        except UnicodeDecodeError:
            text = v.decode("utf-8", "replace")
        hdrs[k] = text
        attr = known.get(k)
        if attr is not None:
            attrs[attr] = text
        # another spelling, or an extension outrelay does not write; k[2:3] first: no other character
        # lower-cases to "_", so it only spares content-type and the like a slice and a lower()
        elif k[2:3] == "_" and k[:3].lower() == "ce_":
            attrs[k[3:].lower()] = text
    body = value or b""
    ctype = hdrs.get("content-type")
    event = event_from_record(attrs, body, ctype)  # binary mode: what from_binary(hdrs, prefix="ce_") does
    return received(event, topic, key.decode() if key is not None else None, hdrs, body, ctype)
