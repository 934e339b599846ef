"""Decoding binary-mode CloudEvents from the wire: what a foreign producer may send."""

from __future__ import annotations

import re
from typing import Any

import pytest

from outrelay import Event, EventError
from outrelay.core.model import cloudevents as ce

FULL = Event(
    type="order.created",
    stream="o-1",
    data=b"\x01\x02",
    tenant="acme",
    correlation_id="c",
    causation_id="k",
    event_version="3",
    schema_version="s1",
    producer_version="p2",
    subject="sub",
    labels={"a": "b"},
    tags=("x", "y"),
    metadata={"m": "1", "traceparent": "00-abc-def-01", "keyid": "k1"},
    sequence=42,
)


def wire(event: Event = FULL, **changes: Any) -> dict[str, str]:
    headers = ce.binary_headers(event, "ce_")
    for name, value in changes.items():
        if value is None:
            headers.pop("ce_" + name, None)
        else:
            headers["ce_" + name] = value
    return headers


def decode(headers: dict[str, str]) -> Event:
    return ce.from_binary(headers, FULL.data, content_type=FULL.content_type, prefix="ce_")


def test_round_trip_every_field() -> None:
    """Every attribute comes back, promoted metadata included, and the time text is kept as sent."""
    headers = wire()
    got = decode(headers)
    assert got == FULL and got.metadata == FULL.metadata and got.labels == FULL.labels
    assert got.time_text == headers["ce_time"]


def test_header_names_any_case_and_unknown_extensions() -> None:
    """Header names match case-insensitively; unknown extensions and other headers are ignored."""
    headers = {k.upper(): v for k, v in wire().items()}
    headers |= {"ce_somethingelse": "1", "content-type": "x/y", "traceparent": "ignored"}
    assert decode(headers) == FULL


def test_only_partitionkey() -> None:
    """Without streamid, the stream is the partitionkey."""
    assert decode(wire(streamid=None)).stream == "o-1"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"id": None}, "attribute 'id' is missing"),
        ({"streamid": None, "partitionkey": None}, "attribute 'partitionkey' is missing"),
        ({"type": "bad type"}, "event type 'bad type' is invalid"),
        ({"id": "has space"}, "event id 'has space' is invalid"),
        ({"time": "noon"}, "event time 'noon' is not RFC 3339"),
        ({"time": "2026-05-01T12:00:00"}, "timezone-aware"),
        ({"labels": "{not json"}, "attribute 'labels' is not JSON"),
        ({"labels": '{"k": 1}'}, "event labels['k'] must be a string"),
        ({"metadata": "[1]"}, "event metadata must be a mapping"),
        ({"tags": '"abc'}, "attribute 'tags' is not JSON"),
        ({"tags": '[""]'}, "tags must be non-empty strings"),
        ({"tags": "5"}, "tags must be a sequence of strings"),
        ({"tags": '"ab"'}, "tags must be a sequence of strings"),
        ({"sequence": "forty"}, "attribute 'sequence' = 'forty' is not an integer"),
        ({"subject": "a\x1b[2Jb"}, "event subject contains U+001B"),
        ({"tenantid": ""}, "event tenant must be a non-empty string"),
        ({"traceparent": "x\x00"}, "event metadata['traceparent'] contains U+0000"),
    ],
)
def test_malformed_is_event_error(changes: dict[str, Any], message: str) -> None:
    """A malformed attribute is an EventError saying which one and why (never another exception)."""
    with pytest.raises(EventError, match=re.escape(message)):
        decode(wire(**changes))
