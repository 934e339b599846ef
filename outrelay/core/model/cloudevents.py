"""CloudEvents 1.0 mapping of the envelope, shared by every transport.

Attribute names (all strings on the wire)::

    id source type time subject datacontenttype specversion   (core)
    partitionkey streamid        <- stream
    tenantid correlationid causationid eventversion schemaversion
    producerversion sequence     <- outbox sequence
    labels metadata              <- JSON objects; tags <- JSON array
    traceparent tracestate       <- metadata keys of the same name (the
    keyid dataref datarefsize       distributed-tracing extension, payload
    datarefdigest                   encryption's key id, claim-check reference):
                                    promoted to their own attributes, back into
                                    metadata on decode

``binary_headers`` gives the binary-mode attributes under a protocol prefix
(``ce-`` HTTP/NATS, ``ce_`` Kafka, ``cloudEvents_`` AMQP); ``datacontenttype``
is left to the protocol's own content-type field unless ``content_type=True``
(NATS: its binding has no such field, so ``ce-datacontenttype`` is a header).
``percent=True`` percent-encodes the values as the HTTP and NATS bindings
require (section 3.1.3.2: space, ``"``, ``%`` and everything outside printable
ASCII, as UTF-8 bytes ``%XY``); ``from_binary(..., percent=True)`` undoes it
(a double-quoted value is unquoted first; invalid UTF-8 is an EventError). ``to_structured`` gives the
JSON structured form (``application/cloudevents+json``): JSON data inline as
``data``, text as a string, anything else as ``data_base64``. The ``from_*``
functions are exact inverses, so readers rebuild the original :class:`Event`,
validated as the constructor does (:meth:`Event.checked`: a foreign producer may
write anything). Decoders that read headers themselves collect the attributes
in the same pass with :func:`attribute_names` and call :func:`from_attributes`.

:raises EventError: when decoding something that is not a CloudEvent.
"""

from __future__ import annotations

import base64
import functools
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote, unquote

import orjson

from outrelay.core.model.envelope import Event, is_json_content_type
from outrelay.core.model.envelope import _checked as checked_event  # Event.checked without its bound-method call
from outrelay.core.model.errors import EventError

__all__ = [
    "PROMOTED_METADATA",
    "STRUCTURED_CONTENT_TYPE",
    "attribute_names",
    "attributes",
    "binary_headers",
    "from_attributes",
    "from_binary",
    "from_structured",
    "is_structured",
    "percent_decode",
    "to_structured",
]

STRUCTURED_CONTENT_TYPE = "application/cloudevents+json"

_SIMPLE = {
    "tenant": "tenantid",
    "correlation_id": "correlationid",
    "causation_id": "causationid",
    "event_version": "eventversion",
    "schema_version": "schemaversion",
    "producer_version": "producerversion",
    "subject": "subject",
}
_SIMPLE_ITEMS = tuple(_SIMPLE.items())

#: Metadata keys carried as CloudEvents extension attributes of their own (not
#: inside the ``metadata`` JSON): W3C trace context (the CloudEvents
#: distributed-tracing extension), the payload-encryption key id, and a
#: claim-check reference (the CloudEvents ``dataref`` extension, with the
#: payload's size and digest: :mod:`outrelay.plugins.claimcheck`).
PROMOTED_METADATA = ("traceparent", "tracestate", "keyid", "dataref", "datarefsize", "datarefdigest")


def attributes(event: Event) -> dict[str, str]:
    """The CloudEvents context attributes of ``event`` (no data), as strings."""
    return _attributes(event, _names(""), True)


def binary_headers(
    event: Event, prefix: str = "ce-", *, content_type: bool = False, percent: bool = False
) -> dict[str, str]:
    """Binary-mode headers: every attribute (``datacontenttype`` only with
    ``content_type``), prefixed; values percent-encoded with ``percent``."""
    headers = _attributes(event, _names(prefix), content_type)
    if percent:
        for name, value in headers.items():
            if _NEEDS_PERCENT.search(value):
                headers[name] = quote(value, safe=_PERCENT_SAFE)
    return headers


#: printable ASCII but space, '"' and '%': kept as is by the HTTP/NATS bindings' percent-encoding
_PERCENT_SAFE = "".join(c for c in map(chr, range(0x21, 0x7F)) if c not in '"%')
_NEEDS_PERCENT = re.compile(r"[^!#$&-~]")  # anything outside _PERCENT_SAFE
_QUOTED_PAIR = re.compile(r"\\(.)")


def percent_decode(value: str) -> str:
    """One header value of the HTTP/NATS binary mode back to the attribute value:
    a double-quoted string is unquoted (RFC 7230 3.2.6), then one round of
    percent-decoding (lower-case hex accepted; ``%`` not followed by two hex
    digits is kept as is).

    :raises EventError: the percent-encoded bytes are not valid UTF-8.
    """
    if len(value) > 1 and value[0] == '"' and value[-1] == '"':
        value = _QUOTED_PAIR.sub(r"\1", value[1:-1])
    if "%" not in value:
        return value
    try:
        return unquote(value, errors="strict")
    except UnicodeDecodeError as exc:
        raise EventError(f"header value {value[:80]!r} is not percent-encoded UTF-8: {exc.reason}") from None


@functools.cache
def _names(prefix: str) -> dict[str, str]:
    """Attribute name -> name on the wire (``prefix`` + name), built once per prefix."""
    core = ("specversion", "id", "source", "type", "time", "partitionkey", "streamid", "datacontenttype")
    extra = ("sequence", "labels", "tags", "metadata", *PROMOTED_METADATA)
    return {n: prefix + n for n in (*core, *_SIMPLE.values(), *extra)}


def _attributes(event: Event, n: dict[str, str], content_type: bool) -> dict[str, str]:
    # one function for both views (called per event per send: no intermediate dict)
    out = {
        n["specversion"]: "1.0",
        n["id"]: event.id,
        n["source"]: event.source,
        n["type"]: event.type,
        n["time"]: event.time_text,
        n["partitionkey"]: event.stream,
        n["streamid"]: event.stream,
    }
    if content_type and event.content_type:
        out[n["datacontenttype"]] = event.content_type
    for field, name in _SIMPLE_ITEMS:
        value = getattr(event, field)
        if value is not None:
            out[n[name]] = value
    if event.sequence is not None:
        out[n["sequence"]] = str(event.sequence)
    if event.labels:
        out[n["labels"]] = orjson.dumps(dict(event.labels)).decode()
    if event.tags:
        out[n["tags"]] = orjson.dumps(list(event.tags)).decode()
    if event.metadata:
        meta = dict(event.metadata)
        for key in PROMOTED_METADATA:
            if key in meta:
                out[n[key]] = meta.pop(key)
        if meta:
            out[n["metadata"]] = orjson.dumps(meta).decode()
    return out


def from_attributes(attrs: Mapping[str, str], data: bytes) -> Event:
    """Rebuild an :class:`Event` from context attributes and the raw data.

    Everything is validated as :class:`Event` does (through :meth:`Event.checked`,
    which runs only the checks of the attributes present).

    :raises EventError: a required attribute is missing, or one is malformed
        (``time`` not RFC 3339, ``labels``/``metadata``/``tags`` not JSON,
        ``sequence`` not an integer, or any check of :class:`Event`).
    """
    get = attrs.get
    try:
        fields: dict[str, Any] = {
            "id": attrs["id"],
            "source": attrs["source"],
            "type": attrs["type"],
            "stream": get("streamid") or attrs["partitionkey"],
        }
    except KeyError as exc:
        raise EventError(f"not a CloudEvent: attribute {exc.args[0]!r} is missing") from exc
    value = get("datacontenttype")
    if value is not None:
        fields["content_type"] = value
    value = get("time")
    if value is not None:
        fields["time"] = value  # Event.checked parses it
    value = get("eventversion")  # outrelay writes it on every event; the rest of _SIMPLE are often all absent
    if value is not None:
        fields["event_version"] = value
    if not _OPTIONAL_NAMES.isdisjoint(attrs):
        for field, name in _OPTIONAL_ITEMS:
            value = get(name)
            if value is not None:
                fields[field] = value
    value = get("sequence")  # on every event a relay sent
    if value is not None:
        try:
            fields["sequence"] = int(value)
        except (TypeError, ValueError):
            raise EventError(f"not a CloudEvent: attribute 'sequence' = {value[:40]!r} is not an integer") from None
    if not _RARE.isdisjoint(attrs):
        _rare(attrs, fields)
    return checked_event(fields, data if type(data) is bytes else bytes(data))


_OPTIONAL_ITEMS = tuple((field, name) for field, name in _SIMPLE_ITEMS if field != "event_version")
_OPTIONAL_NAMES = frozenset(name for _, name in _OPTIONAL_ITEMS)
_RARE = frozenset(("labels", "metadata", "tags", *PROMOTED_METADATA))


def _rare(attrs: Mapping[str, str], fields: dict[str, Any]) -> None:
    """Add the JSON-valued attributes and the promoted metadata keys to ``fields``."""
    get = attrs.get
    for name in ("labels", "metadata", "tags"):
        value = get(name)
        if value is not None:
            try:
                fields[name] = orjson.loads(value)
            except orjson.JSONDecodeError as exc:
                raise EventError(f"not a CloudEvent: attribute {name!r} is not JSON: {exc}") from None
    for key in PROMOTED_METADATA:
        value = get(key)
        if value is not None:
            meta = fields.get("metadata")
            if not meta:  # absent, or a JSON value that Event reads as empty
                meta = fields["metadata"] = {}
            elif not isinstance(meta, dict):
                raise EventError(f"event metadata must be a mapping of strings, got {type(meta).__name__}")
            meta[key] = value


@functools.cache
def attribute_names(prefix: str) -> Mapping[str, str]:
    """Header name as :func:`binary_headers` writes it -> attribute name, for decoders that
    collect the attributes in the same pass as the headers; a header not in it is an
    attribute when its lower-cased name starts with ``prefix`` (what :func:`from_binary` does).
    One shared dict per prefix (a plain dict: a mappingproxy lookup costs more): do not change it."""
    return {wire: name for name, wire in _names(prefix).items()}


def is_structured(content_type: str | None) -> bool:
    """True for the structured mode's content type (``application/cloudevents+json``, any case, any parameters)."""
    # shorter types (application/octet-stream, application/json, text/plain; charset=utf-8) end at len()
    return (
        content_type is not None
        and len(content_type) >= 28
        and content_type.split(";", 1)[0].strip().lower() == STRUCTURED_CONTENT_TYPE
    )


def from_binary(
    headers: Mapping[str, str], data: bytes, *, content_type: str | None, prefix: str = "ce-", percent: bool = False
) -> Event:
    """Inverse of :func:`binary_headers`; header names match case-insensitively.
    ``content_type`` (the protocol's own field) is the data content type unless
    a ``datacontenttype`` header is present; ``percent`` decodes every value with
    :func:`percent_decode`."""
    known = attribute_names(prefix)
    plen = len(prefix)
    low = prefix.lower()
    attrs: dict[str, str] = {}
    for k, v in headers.items():
        name = known.get(k)
        if name is None:  # another spelling, an unknown extension, or not an attribute
            if not k.lower().startswith(low):
                continue
            name = k[plen:].lower()
        attrs[name] = percent_decode(v) if percent else v
    if content_type and "datacontenttype" not in attrs:
        attrs["datacontenttype"] = content_type
    return from_attributes(attrs, data)


def to_structured(event: Event) -> bytes:
    """The JSON structured form of ``event``, encoded once."""
    body: dict[str, Any] = dict(attributes(event))
    ctype = event.content_type
    if event.data:
        if is_json_content_type(ctype):
            body["data"] = orjson.Fragment(event.data)
        elif ctype and ctype.lower().startswith("text/"):
            try:
                body["data"] = event.data.decode("utf-8")
            except UnicodeDecodeError:
                body["data_base64"] = base64.b64encode(event.data).decode()
        else:
            body["data_base64"] = base64.b64encode(event.data).decode()
    return orjson.dumps(body)


def from_structured(body: bytes | str) -> Event:
    """Inverse of :func:`to_structured`."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise EventError(f"not a structured CloudEvent: {exc}") from exc
    if not isinstance(doc, dict):
        raise EventError("not a structured CloudEvent: the body is not a JSON object")
    data: bytes = b""
    if "data_base64" in doc:
        data = base64.b64decode(doc.pop("data_base64"))
    elif "data" in doc:
        value = doc.pop("data")
        if is_json_content_type(doc.get("datacontenttype")) or not isinstance(value, str):
            data = orjson.dumps(value)
        else:
            data = value.encode("utf-8")
    return from_attributes({k: v for k, v in doc.items() if isinstance(v, str)}, data)
