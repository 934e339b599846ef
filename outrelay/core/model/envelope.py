"""The event envelope: immutable, validated at construction.

An :class:`Event` carries outrelay's envelope (the CloudEvents mapping of its
fields is in :mod:`outrelay.core.model.cloudevents`). ``data`` is always stored as
bytes: a ``bytes``-like value is kept verbatim, a ``str`` is UTF-8 encoded, and
any other value is encoded once as JSON (orjson). The content type defaults
accordingly (``application/octet-stream``, ``text/plain; charset=utf-8``,
``application/json``). Invalid values raise :class:`~outrelay.EventError`.

``sequence`` is assigned by the outbox on append and is ``None`` before that.

Two lean constructors skip the dataclass machinery: :meth:`Event.checked` for
what comes off the wire (the constructor's validation, same errors) and
:meth:`Event.from_attributes` for rows a store wrote (trusted: no validation).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

import orjson

from outrelay.core.model._draft import drafting
from outrelay.core.model._event_checks import BAD_CHAR as _BAD_CHAR
from outrelay.core.model._event_checks import bad_char as _bad_char
from outrelay.core.model._event_checks import (
    check_id,
    check_optional,
    check_source,
    check_stream,
    check_tags,
    check_text,
    check_time,
    check_type,
)
from outrelay.core.model._event_checks import has_non_finite as _has_non_finite
from outrelay.core.model.errors import EventError
from outrelay.core.model.ids import is_valid_id, uuid7

__all__ = ["JSON_CONTENT_TYPES", "Event", "is_json_content_type"]

JSON_CONTENT_TYPES = ("application/json", "text/json")
_EMPTY: Mapping[str, str] = MappingProxyType({})


def is_json_content_type(content_type: str | None) -> bool:
    """True for ``application/json``, ``text/json`` and ``*+json`` types."""
    if not content_type:
        return False
    base = content_type.split(";", 1)[0].strip().lower()
    return base in JSON_CONTENT_TYPES or base.endswith("+json")


def _str_map(name: str, value: Mapping[str, Any] | None) -> Mapping[str, str]:
    if not value:
        return _EMPTY
    if not isinstance(value, Mapping):
        raise EventError(f"event {name} must be a mapping of strings, got {type(value).__name__}")
    out: dict[str, str] = {}
    for k, v in value.items():
        if not isinstance(k, str) or not k:
            raise EventError(f"event {name} keys must be non-empty strings, got {k!r}")
        if not isinstance(v, str):
            raise EventError(f"event {name}[{k!r}] must be a string, got {type(v).__name__}")
        if not k.isprintable() and _BAD_CHAR.search(k):
            raise _bad_char(f"{name} key {k!r}", k)
        if not v.isprintable() and _BAD_CHAR.search(v):
            raise _bad_char(f"{name}[{k!r}]", v)
        out[k] = v
    return MappingProxyType(out)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """One immutable event. See the module docstring for ``data`` encoding.

    :raises EventError: empty or malformed ``type``/``stream``, a bad ``id``,
        a naive ``time``, ``data`` that cannot be encoded as JSON (NaN and
        infinities included), or a control character (C0, DEL, C1) or lone
        surrogate in any text field, label, tag or metadata key/value.
    """

    type: str
    stream: str
    data: Any = None
    id: str = dataclasses.field(default_factory=uuid7)
    source: str = "outrelay"
    time: datetime = dataclasses.field(default_factory=lambda: datetime.now(UTC))
    tenant: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    event_version: str = "1"
    schema_version: str | None = None
    producer_version: str | None = None
    subject: str | None = None
    labels: Mapping[str, str] = dataclasses.field(default_factory=lambda: _EMPTY)
    tags: tuple[str, ...] = ()
    content_type: str | None = None
    metadata: Mapping[str, str] = dataclasses.field(default_factory=lambda: _EMPTY)
    sequence: int | None = None
    _time_text: str | None = dataclasses.field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        check_type(self.type)
        check_stream(self.stream)
        check_id(self.id)
        check_source(self.source)
        set_(self, "time", check_time(self.time).astimezone(UTC))
        if isinstance(self.event_version, int):
            set_(self, "event_version", str(self.event_version))
        for name in _OPTIONAL:
            check_optional(name, getattr(self, name))
        for name in ("stream", "source", "event_version", "content_type"):
            check_text(name, getattr(self, name))
        set_(self, "labels", _str_map("labels", self.labels))
        set_(self, "metadata", _str_map("metadata", self.metadata))
        set_(self, "tags", check_tags(self.tags))
        data, ctype = _encode_data(self.data, self.content_type)
        set_(self, "data", data)
        set_(self, "content_type", ctype)

    def __hash__(self) -> int:
        return hash((self.id, self.sequence))

    # -- derived views --------------------------------------------------

    @property
    def time_text(self) -> str:
        """``time`` as RFC 3339 UTC text (``...Z``), computed once per event."""
        text = self._time_text
        if text is None:
            text = self.time.isoformat().replace("+00:00", "Z")
            object.__setattr__(self, "_time_text", text)
        return text

    def json(self) -> Any:
        """Decode ``data`` as JSON. :raises EventError: if it is not JSON."""
        try:
            return orjson.loads(self.data) if self.data else None
        except orjson.JSONDecodeError as exc:
            raise EventError(f"event {self.id} data is not JSON ({self.content_type})") from exc

    def with_sequence(self, sequence: int) -> Event:
        """A copy carrying the outbox sequence (no re-validation: cheap)."""
        d = _draft()
        d.type, d.stream, d.data, d.id, d.source = self.type, self.stream, self.data, self.id, self.source
        d.time, d._time_text = self.time, self._time_text
        d.event_version, d.content_type = self.event_version, self.content_type
        d.tenant, d.correlation_id, d.causation_id = self.tenant, self.correlation_id, self.causation_id
        d.schema_version, d.producer_version, d.subject = self.schema_version, self.producer_version, self.subject
        d.labels, d.tags, d.metadata, d.sequence = self.labels, self.tags, self.metadata, sequence
        return _seal(d)

    def replace(self, **changes: Any) -> Event:
        """Return a copy with ``changes`` applied (events are immutable)."""
        return dataclasses.replace(self, **changes)

    def attributes(self) -> dict[str, Any]:
        """Every field but ``data``, as JSON-ready values (used by the stores)."""
        return {
            "id": self.id,
            "type": self.type,
            "stream": self.stream,
            "source": self.source,
            "time": self.time_text,
            "tenant": self.tenant,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "event_version": self.event_version,
            "schema_version": self.schema_version,
            "producer_version": self.producer_version,
            "subject": self.subject,
            "labels": dict(self.labels),
            "tags": list(self.tags),
            "content_type": self.content_type,
            "metadata": dict(self.metadata),
        }

    @classmethod
    def from_attributes(cls, attrs: Mapping[str, Any], data: bytes, sequence: int | None = None) -> Event:
        """Inverse of :meth:`attributes` for trusted input (what a store wrote).

        Skips validation, which already ran when the event was created;
        ``data`` is taken verbatim.
        """
        d = _draft()
        get = attrs.get
        d.id = get("id")
        d.type = get("type")
        d.stream = get("stream")
        d.source = get("source")
        d.tenant = get("tenant")
        d.correlation_id = get("correlation_id")
        d.causation_id = get("causation_id")
        d.event_version = get("event_version")
        d.schema_version = get("schema_version")
        d.producer_version = get("producer_version")
        d.subject = get("subject")
        d.content_type = get("content_type")
        text = str(attrs["time"])
        d.time = _fromiso(text)  # RFC 3339 with "Z" (Python 3.11+)
        d._time_text = text
        labels, metadata, tags = get("labels"), get("metadata"), get("tags")
        d.labels = MappingProxyType(labels) if labels else _EMPTY
        d.metadata = MappingProxyType(metadata) if metadata else _EMPTY
        d.tags = tuple(tags) if tags else ()
        d.data = data if type(data) is bytes else bytes(data)
        d.sequence = sequence
        return _seal(d)

    @classmethod
    def checked(cls, fields: Mapping[str, Any], data: bytes) -> Event:
        """``Event(**fields, data=data)`` for decoders of untrusted input, at about half the cost.

        The same checks run in the same order and raise the same errors, but only
        for the fields present, and the slots are filled directly. ``fields``
        must hold ``type`` and ``stream``; ``time`` may also be RFC 3339 text,
        parsed here (:attr:`time_text` renders it in canonical form when first read).
        ``data`` is bytes (another value is encoded as the constructor does).

        :raises EventError: as the constructor; also for ``time`` text that is not RFC 3339.
        """
        return _checked(fields, data)

    def __repr__(self) -> str:
        return (
            f"Event(id={self.id!r}, type={self.type!r}, stream={self.stream!r}, "
            f"tenant={self.tenant!r}, sequence={self.sequence!r}, data=<{len(self.data)} bytes>)"
        )


_ALL_FIELDS = tuple(f.name for f in dataclasses.fields(Event))
# every field, as the lean constructors below fill them by name
_FILLED = {"id", "type", "stream", "source", "time", "_time_text", "data", "sequence", "event_version", "content_type"}
_FILLED |= {"tenant", "correlation_id", "causation_id", "schema_version", "producer_version", "subject"}
_FILLED |= {"labels", "tags", "metadata"}
if set(_ALL_FIELDS) != _FILLED:  # pragma: no cover - a changed Event
    raise ImportError("Event's lean constructors fill each of its fields by name: update them with the fields")

# The lean constructors (from_attributes, checked, with_sequence) run once per event claimed or
# received: they fill a draft with plain attribute stores and seal it as an Event (see _draft.py).
_draft, _seal = drafting(Event)
_fromiso = datetime.fromisoformat


def _encode_data(data: Any, content_type: str | None) -> tuple[bytes, str | None]:
    if isinstance(data, bytes | bytearray | memoryview):
        raw = bytes(data)
        return raw, content_type or ("application/octet-stream" if raw else None)
    if isinstance(data, str) and not is_json_content_type(content_type):
        try:
            return data.encode("utf-8"), content_type or "text/plain; charset=utf-8"
        except UnicodeEncodeError as exc:
            raise EventError(f"event data is not valid text: {exc.reason} at index {exc.start}") from exc
    if data is None and content_type is None:
        return b"", None
    try:
        raw = orjson.dumps(data)
    except TypeError as exc:  # orjson.JSONEncodeError, lone surrogates included
        raise EventError(f"event data is not JSON-serialisable: {exc}; pass bytes or JSON values") from exc
    if _has_non_finite(data, raw):
        raise EventError("event data contains NaN or Infinity, which JSON cannot represent; use null or a string")
    return raw, content_type or "application/json"


_OPTIONAL = ("tenant", "correlation_id", "causation_id", "schema_version", "producer_version", "subject")
_OPTIONAL_SET = frozenset(_OPTIONAL)
_GOOD_TYPES: set[str] = set()


def _checked(fields: Mapping[str, Any], data: Any) -> Event:
    # Event.__post_init__ for the fields present, with fast paths; the rules and messages are the shared
    # check_* functions, and tests/core/test_envelope_checked.py holds the two paths equal
    get = fields.get
    type_, stream = fields["type"], fields["stream"]
    if type(type_) is not str or type_ not in _GOOD_TYPES:  # (a list is unhashable)
        check_type(type_)
        if len(_GOOD_TYPES) < 4096:  # a topic carries few types: the regex runs once per type
            _GOOD_TYPES.add(type_)
    good = _GOOD_TEXT  # strings that passed every text check before: streams, sources, versions, content types
    if type(stream) is not str or stream not in good:
        check_stream(stream)
    id_ = fields["id"] if "id" in fields else uuid7()
    if type(id_) is not str or not is_valid_id(id_):  # check_id's test without its call: it raises
        check_id(id_)
    source = get("source", "outrelay")
    if type(source) is not str or source not in good:
        check_source(source)
    time = _checked_time(fields)
    version = get("event_version", "1")
    if isinstance(version, int):
        version = str(version)
    d = _draft()
    if _OPTIONAL_SET.isdisjoint(fields):
        d.tenant = d.correlation_id = d.causation_id = d.schema_version = d.producer_version = d.subject = None
    else:
        _checked_optional(d, get)
    ctype = get("content_type")
    try:
        known = stream in good and source in good and version in good and (ctype is None or ctype in good)
    except TypeError:  # an unhashable version or content type (the constructor lets a list through)
        known = False
    if not known:
        _check_texts(stream, source, version, ctype)
    labels, metadata = get("labels"), get("metadata")
    d.labels = _str_map("labels", labels) if labels else _EMPTY
    d.metadata = _str_map("metadata", metadata) if metadata else _EMPTY
    d.tags = check_tags(fields["tags"]) if "tags" in fields else ()
    if type(data) is bytes:
        ctype = ctype or ("application/octet-stream" if data else None)
    else:
        data, ctype = _encode_data(data, ctype)
    d.id = id_
    d.type = type_
    d.stream = stream
    d.source = source
    d.time = time
    d._time_text = None  # rendered when first read: a consumer rarely needs it
    d.event_version = version
    d.content_type = ctype
    d.data = data
    d.sequence = get("sequence")
    return _seal(d)


def _checked_time(fields: Mapping[str, Any]) -> datetime:
    """The event time of ``fields`` in UTC: parsed from text, now when absent, else checked."""
    time = fields.get("time")
    if type(time) is str:
        time = _parse_time(time)
    elif time is None and "time" not in fields:
        time = datetime.now(UTC)
    if type(time) is not datetime or time.tzinfo is not UTC:  # fromisoformat gives UTC itself for "Z"
        time = check_time(time)
        if time.tzinfo is not UTC:
            time = time.astimezone(UTC)
    return time


def _checked_optional(d: Any, get: Callable[[str], Any]) -> None:
    """Set the optional text fields on the draft ``d``, checking any that is not a printable
    non-empty string (only those may be refused by check_optional)."""
    for name in _OPTIONAL:
        value = get(name)
        if value is not None and not (type(value) is str and value and value.isprintable()):
            check_optional(name, value)
        setattr(d, name, value)


#: strings valid as a stream, a source, an event version and a content type alike (non-empty, at
#: most 512 characters, printable): the values a topic's events repeat, so each is checked once
_GOOD_TEXT: set[str] = set()


def _check_texts(stream: str, source: str, version: Any, ctype: Any) -> None:
    """The text checks of ``_checked`` (no control character or lone surrogate), in the
    constructor's order; then remembers the values that pass every text rule in ``_GOOD_TEXT``."""
    plain = stream.isprintable() and source.isprintable()
    plain = plain and (not isinstance(version, str) or version.isprintable())
    if not (plain and (not isinstance(ctype, str) or ctype.isprintable())):  # rare: the first refused one, in order
        for name, value in (
            ("stream", stream),
            ("source", source),
            ("event_version", version),
            ("content_type", ctype),
        ):
            check_text(name, value)
    if len(_GOOD_TEXT) < 4096:  # bounded: past it, every value is checked each time
        for value in (stream, source, version, ctype):
            if type(value) is str and 0 < len(value) <= 512 and value.isprintable():
                _GOOD_TEXT.add(value)


def _parse_time(text: str) -> datetime:
    """RFC 3339 text -> datetime (its canonical text, :attr:`Event.time_text`, is rendered when first read).

    :raises EventError: ``text`` is not RFC 3339."""
    try:
        return _fromiso(text)
    except (ValueError, TypeError):
        raise EventError(f"event time {text[:64]!r} is not RFC 3339 date-time text") from None
