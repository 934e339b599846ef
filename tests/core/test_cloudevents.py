"""CloudEvents mapping."""

from __future__ import annotations

import orjson
import pytest

from outrelay import Event, EventError
from outrelay.core.model import cloudevents as ce

EVENTS = [
    Event(type="workflow.created", stream="wf-1", data={"a": [1, 2]}, tenant="acme", sequence=5),
    Event(type="t", stream="s", data=b"\x00\xff\xfe", labels={"k": "v"}, tags=("a",), metadata={"m": "1"}),
    Event(type="t", stream="s", data="unicodé ✓"),
    Event(type="t", stream="s"),
    Event(type="t", stream="s", data=b""),
]


@pytest.mark.parametrize("event", EVENTS)
def test_structured_round_trip(event: Event) -> None:
    """The structured JSON form decodes back to an equal event."""
    assert ce.from_structured(ce.to_structured(event)) == event


@pytest.mark.parametrize("event", EVENTS)
def test_binary_round_trip(event: Event) -> None:
    """Binary-mode headers plus the raw data decode back to an equal event."""
    headers = ce.binary_headers(event, prefix="ce_")
    assert "ce_datacontenttype" not in headers
    assert ce.from_binary(headers, event.data, content_type=event.content_type, prefix="ce_") == event


def test_structured_json_data_inline() -> None:
    """JSON data is embedded as a JSON value, not re-encoded as a string."""
    doc = orjson.loads(ce.to_structured(EVENTS[0]))
    assert doc["data"] == {"a": [1, 2]}
    assert doc["specversion"] == "1.0" and doc["partitionkey"] == "wf-1" and doc["tenantid"] == "acme"
    assert doc["sequence"] == "5"


def test_binary_data_base64() -> None:
    """Non-text data travels as data_base64."""
    assert "data_base64" in orjson.loads(ce.to_structured(EVENTS[1]))


def test_not_a_cloudevent() -> None:
    """Decoding something that is not a CloudEvent raises EventError."""
    with pytest.raises(EventError):
        ce.from_structured(b'{"hello": 1}')
    with pytest.raises(EventError):
        ce.from_structured(b"not json")
