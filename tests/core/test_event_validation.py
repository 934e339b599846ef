"""Event validation: control characters, lone surrogates and non-finite numbers are EventErrors at construction."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from outrelay import Event, EventError, Outbox

BAD_CHARS = ["\r", "\n", "\x00", "\x1b", "\x7f", "\x85", "\x9f", "\t"]
TEXT_FIELDS = ["stream", "source", "tenant", "subject", "correlation_id", "causation_id", "schema_version"]


@pytest.mark.parametrize("field", TEXT_FIELDS)
@pytest.mark.parametrize("char", BAD_CHARS)
def test_control_characters_refused_in_text_fields(field: str, char: str) -> None:
    """A C0/DEL/C1 character in any text field is one EventError naming the field and the character."""
    kwargs: dict[str, Any] = {"type": "t", "stream": "s", field: f"ok{char}forged"}
    with pytest.raises(EventError) as info:
        Event(**kwargs)
    text = str(info.value)
    assert f"event {field} " in text and f"U+{ord(char):04X}" in text and "\n" not in text


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"labels": {"k\n": "v"}}, "labels key"),
        ({"labels": {"k": "v\r\n"}}, "labels['k']"),
        ({"metadata": {"k": "\x00"}}, "metadata['k']"),
        ({"metadata": {"\x1b[31m": "v"}}, "metadata key"),
        ({"tags": ("ok", "bad\x85")}, "tag"),
        ({"content_type": "text/plain\r\nX-Evil: 1"}, "content_type"),
    ],
)
def test_control_characters_refused_in_maps_and_tags(kwargs: dict[str, Any], named: str) -> None:
    """Labels, metadata keys and values and tags refuse control characters, naming where."""
    with pytest.raises(EventError, match=r"control characters"):
        Event(type="t", stream="s", **kwargs)
    with pytest.raises(EventError) as info:
        Event(type="t", stream="s", **kwargs)
    assert named in str(info.value)


@pytest.mark.parametrize("field", ["stream", "tenant", "subject"])
def test_lone_surrogate_is_an_event_error(field: str) -> None:
    """A lone surrogate in a text field is an EventError, not a TypeError or UnicodeEncodeError."""
    with pytest.raises(EventError, match="U\\+D800"):
        Event(**{"type": "t", "stream": "s", field: "a\ud800"})


@pytest.mark.parametrize("data", ["text \udc00", {"k": "\ud800"}, {"\udfff": 1}, ["\ud83d"]])
def test_lone_surrogate_in_data_is_an_event_error(data: Any) -> None:
    """A lone surrogate in str or JSON data is an EventError."""
    with pytest.raises(EventError):
        Event(type="t", stream="s", data=data)


@dataclasses.dataclass
class Point:
    x: float


@pytest.mark.parametrize(
    "data",
    [float("nan"), float("inf"), {"a": [1, {"b": float("-inf")}]}, (1.0, float("nan")), [Point(float("nan"))]],
)
def test_non_finite_numbers_refused(data: Any) -> None:
    """NaN and infinities in JSON data are refused, not stored as null."""
    with pytest.raises(EventError, match="NaN or Infinity"):
        Event(type="t", stream="s", data=data)


def test_null_and_printable_unicode_accepted(tmp_path: Any) -> None:
    """Real nulls, non-ASCII text, emoji with joiners and NBSP stay valid and round-trip through the store."""
    ev = Event(
        type="t",
        stream="café\u00a0s",
        tenant="👩\u200d💻",
        labels={"k": "ü"},
        data={"a": None, "b": 1.5, "c": "x\ny"},  # control characters inside data are fine (it is JSON)
    )
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    try:
        outbox.append(ev)
        (stored,) = outbox.store.events()
        assert stored.json() == {"a": None, "b": 1.5, "c": "x\ny"} and stored.tenant == ev.tenant
    finally:
        outbox.close()
