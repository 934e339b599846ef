"""One stream entry of the ``redis`` transport: :func:`encode` (the XADD fields of an event) and
:func:`decode` (an entry read back).

Binary mode (default) stores the CloudEvents attributes as ``ce_*`` fields,
``content-type`` and the raw ``data``; structured mode stores ``content-type:
application/cloudevents+json`` and the JSON event as ``data``. The script path
of :mod:`._batch` writes the same fields without building this dict.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from outrelay.kit import (
    STRUCTURED_CONTENT_TYPE,
    Event,
    Received,
    attribute_names,
    binary_headers,
    from_attributes,
    from_structured,
    is_structured,
    to_structured,
)

__all__ = ["decode", "encode"]


def encode(event: Event, mode: str) -> dict[str, str | bytes]:
    """The XADD fields of ``event`` in binary or structured mode."""
    if mode == "structured":
        return {"content-type": STRUCTURED_CONTENT_TYPE, "data": to_structured(event)}
    fields: dict[str, str | bytes] = dict(binary_headers(event, "ce_"))
    if event.content_type:
        fields["content-type"] = event.content_type
    fields["data"] = event.data
    return fields


# field name as the transport writes it (bytes from redis-py; str with decode_responses) -> (name, attribute or "")
_FIELDS: dict[Any, tuple[str, str]] = {}
for _name, _attr in [*attribute_names("ce_").items(), ("content-type", ""), ("data", "")]:
    _FIELDS[_name] = _FIELDS[_name.encode()] = (_name, _attr)


def decode(key: str, fields: Mapping[Any, Any]) -> Received:
    """Rebuild a :class:`Received` from one stream entry (binary or structured mode).

    ``headers`` holds every field but ``data`` (values decoded as UTF-8, invalid
    bytes replaced); ``body`` the raw ``data``.

    :raises EventError: the entry is not an outrelay CloudEvent.
    :raises UnicodeDecodeError: a field name is not UTF-8.
    """
    headers: dict[str, str] = {}
    attrs: dict[str, str] = {}
    body: Any = b""
    for k, v in fields.items():  # one pass: names and values decoded, attributes collected
        hit = _FIELDS.get(k)
        if hit is not None:
            name, attr = hit
        else:  # another spelling, an extension outrelay does not write, or a foreign field
            name = k.decode() if isinstance(k, bytes) else str(k)
            attr = name[3:].lower() if name[:3].lower() == "ce_" else ""
        if name == "data":
            body = v
            continue
        text = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        headers[name] = text
        if attr:
            attrs[attr] = text
    if not isinstance(body, bytes):
        body = str(body).encode()
    ctype = headers.get("content-type")
    if is_structured(ctype):
        event = from_structured(body)
    else:
        if ctype and "datacontenttype" not in attrs:
            attrs["datacontenttype"] = ctype
        event = from_attributes(attrs, body)  # what from_binary(headers, prefix="ce_") does
    return Received(event, key, event.stream, headers, body, ctype)
