"""Event.checked: the constructor's validation without its machinery, for decoders of untrusted input."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from outrelay import Event, EventError

T0 = datetime(2026, 5, 1, 12, 30, 15, 123456, tzinfo=UTC)
BASE: dict[str, Any] = {"id": "e-1", "source": "svc", "type": "order.created", "stream": "o-1"}

# one field (or two) changed from BASE: valid, invalid, and several invalid at once (the first one reported wins)
VARIANTS: list[dict[str, Any]] = [
    {},
    {"time": T0, "tenant": "acme", "subject": "x", "event_version": "2", "content_type": "text/plain"},
    {"time": datetime(2026, 1, 1, 9, tzinfo=timezone(timedelta(hours=2)))},
    {"event_version": 3},
    {"event_version": None},
    {"event_version": ""},
    {"labels": {"k": "v"}, "metadata": {"traceparent": "00-ab"}, "tags": ("a", "b")},
    {"labels": {}, "metadata": [], "tags": []},
    {"labels": None, "metadata": 0},
    {"sequence": 7},
    {"content_type": ""},
    {"type": ""},
    {"type": "bad type"},
    {"type": 5},
    {"type": ["order.created"]},
    {"stream": ""},
    {"stream": "x" * 513},
    {"stream": None},
    {"stream": "a\x00b"},
    {"id": ""},
    {"id": "has space"},
    {"id": None},
    {"source": ""},
    {"source": "s\x1b[31m"},
    {"time": datetime(2026, 1, 1)},
    {"time": None},
    {"tenant": ""},
    {"tenant": 5},
    {"correlation_id": "c\u0085"},
    {"subject": "\ud800"},
    {"event_version": "1\x7f"},
    {"content_type": "text/plain\r\nX: y"},
    {"labels": {"k": 1}},
    {"labels": {"": "v"}},
    {"labels": ["k"]},
    {"metadata": {"k\n": "v"}},
    {"tags": "abc"},
    {"tags": ("a", "")},
    {"tags": ("a", 3)},
    {"tags": ("a\x00",)},
    {"tags": 5},
    {"type": "", "stream": ""},
    {"tenant": "", "subject": ""},
    {"stream": "a\x00", "source": "b\x00"},
    {"labels": {"k": 1}, "metadata": {"k": 1}},
    {"id": "", "time": datetime(2026, 1, 1)},
]


def outcome(make: Any) -> Any:
    try:
        return make()
    except Exception as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize("change", VARIANTS, ids=repr)
@pytest.mark.parametrize("data", [b"", b"\x00payload"], ids=["empty", "bytes"])
def test_same_outcome_as_constructor(change: dict[str, Any], data: bytes) -> None:
    """checked() returns an equal event, or raises the same error with the same message, as Event(**fields)."""
    fields = {**BASE, "time": T0, **change}
    want, got = outcome(lambda: Event(**fields, data=data)), outcome(lambda: Event.checked(fields, data))
    assert got == want
    if isinstance(want, Event):
        assert (got.content_type, got.data, got.labels, got.tags, got.metadata) == (
            want.content_type,
            want.data,
            want.labels,
            want.tags,
            want.metadata,
        )
        assert got.time.tzinfo is UTC and got.time_text == want.time_text


def test_defaults_like_constructor() -> None:
    """Absent fields get the constructor's defaults (a new id, now, source, version "1")."""
    e = Event.checked({"type": "t", "stream": "s"}, b"")
    assert len(e.id) == 36 and e.source == "outrelay" and e.event_version == "1"
    assert abs((datetime.now(UTC) - e.time).total_seconds()) < 60
    assert e.labels == {} and e.tags == () and e.sequence is None and e.content_type is None


@pytest.mark.parametrize(
    ("text", "kept"),
    [
        ("2026-05-01T12:30:15.123456Z", True),
        ("2026-05-01T12:30:15Z", True),
        ("2026-05-01T12:30:15.000000Z", False),  # isoformat drops zero microseconds
        ("2026-05-01T12:30:15.5Z", False),
        ("2026-05-01T14:30:15+02:00", False),
        ("2026-05-01T12:30:15+00:00", False),
        ("2026-05-01 12:30:15Z", False),
    ],
)
def test_time_text(text: str, kept: bool) -> None:
    """RFC 3339 text is parsed; text in outrelay's own form is kept as time_text, other forms are re-rendered."""
    e = Event.checked({**BASE, "time": text}, b"")
    assert e.time == datetime.fromisoformat(text) and e.time.tzinfo is UTC
    assert e.time_text == e.time.isoformat().replace("+00:00", "Z")
    assert (e.time_text == text) is kept


@pytest.mark.parametrize("text", ["", "yesterday", "2026-13-01T00:00:00Z", "2026-05-01T12:30:15"])
def test_bad_time_text(text: str) -> None:
    """Time text that is not RFC 3339 with an offset is an EventError naming the value."""
    with pytest.raises(EventError, match="event time"):
        Event.checked({**BASE, "time": text}, b"")


texts = st.text(max_size=12)
values = st.one_of(
    st.none(), texts, st.integers(), st.lists(texts, max_size=3), st.dictionaries(texts, texts, max_size=2)
)


@settings(max_examples=150, deadline=None)
@given(
    st.fixed_dictionaries(
        {"type": st.one_of(texts, st.just("t.x")), "stream": st.one_of(texts, st.just("s"))},
        optional={
            name: values
            for name in (
                "id",
                "source",
                "tenant",
                "subject",
                "causation_id",
                "event_version",
                "content_type",
                "labels",
                "metadata",
                "tags",
            )
        },
    )
)
def test_same_outcome_fuzzed(fields: dict[str, Any]) -> None:
    """Whatever a foreign producer sends, checked() agrees with the constructor."""
    fields["time"] = T0
    fields.setdefault("id", "e-1")  # a generated id differs between the two
    assert outcome(lambda: Event.checked(fields, b"x")) == outcome(lambda: Event(**fields, data=b"x"))


def test_remembered_text_still_checked_per_field() -> None:
    """A value accepted in one field is still refused where another field's rule refuses it."""
    long = "x" * 600
    Event.checked({**BASE, "source": long, "event_version": ""}, b"")  # both valid there
    with pytest.raises(EventError, match="stream"):
        Event.checked({**BASE, "stream": long}, b"")
    with pytest.raises(EventError, match="stream"):
        Event.checked({**BASE, "stream": ""}, b"")
    with pytest.raises(EventError, match="source"):
        Event.checked({**BASE, "source": ""}, b"")
    e = Event.checked({**BASE, "stream": "s-1", "event_version": "s-1", "content_type": "s-1"}, b"x")
    assert (e.stream, e.event_version, e.content_type) == ("s-1", "s-1", "s-1")
