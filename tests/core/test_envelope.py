"""The event envelope."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from outrelay import Event, EventError
from outrelay.core.model.ids import uuid7


class TestEvent:
    def test_defaults(self) -> None:
        """An event gets a UUIDv7 id, a UTC time and JSON-encoded data by default."""
        e = Event(type="workflow.created", stream="wf-1", data={"a": 1})
        assert len(e.id) == 36 and e.id[14] == "7"
        assert e.time.tzinfo is UTC
        assert e.data == b'{"a":1}'
        assert e.content_type == "application/json"
        assert e.json() == {"a": 1}

    def test_bytes_and_text_kept(self) -> None:
        """Bytes are kept verbatim and text is UTF-8 encoded, with matching content types."""
        assert Event(type="t", stream="s", data=b"\xff\x00").data == b"\xff\x00"
        assert Event(type="t", stream="s", data=b"\xff").content_type == "application/octet-stream"
        e = Event(type="t", stream="s", data="héllo")
        assert e.data == "héllo".encode() and e.content_type.startswith("text/plain")

    def test_immutable(self) -> None:
        """Events cannot be changed after construction."""
        e = Event(type="t", stream="s")
        with pytest.raises(AttributeError):
            e.type = "x"  # type: ignore[misc]
        with pytest.raises(TypeError):
            e.labels["k"] = "v"  # type: ignore[index]

    @pytest.mark.parametrize(
        "kwargs",
        [
            {"type": "", "stream": "s"},
            {"type": "has space", "stream": "s"},
            {"type": "t", "stream": ""},
            {"type": "t", "stream": "s", "id": "bad id"},
            {"type": "t", "stream": "s", "id": ""},
            {"type": "t", "stream": "s", "data": {1, 2}},
            {"type": "t", "stream": "s", "time": datetime(2026, 1, 1)},
            {"type": "t", "stream": "s", "labels": {"k": 1}},
            {"type": "t", "stream": "s", "tags": "notalist"},
            {"type": "t", "stream": "s", "tenant": ""},
        ],
    )
    def test_invalid_values_raise(self, kwargs: dict) -> None:
        """Invalid envelope values raise EventError at construction."""
        with pytest.raises(EventError):
            Event(**kwargs)

    def test_time_normalised_to_utc(self) -> None:
        """An aware time in another zone is stored as UTC."""
        t = datetime(2026, 1, 1, 12, tzinfo=timezone(timedelta(hours=2)))
        assert Event(type="t", stream="s", time=t).time == datetime(2026, 1, 1, 10, tzinfo=UTC)

    def test_attributes_round_trip(self) -> None:
        """attributes()/from_attributes() rebuild an equal event."""
        e = Event(
            type="t",
            stream="s",
            data=b"x",
            tenant="acme",
            correlation_id="c",
            causation_id="k",
            subject="sub",
            labels={"a": "b"},
            tags=("x", "y"),
            metadata={"m": "n"},
            event_version=3,
            schema_version="2",
            producer_version="1.2",
        )
        assert Event.from_attributes(e.attributes(), e.data, 7) == e.replace(sequence=7)

    def test_repr_hides_payload(self) -> None:
        """The repr shows the size of the data, never its content."""
        assert "secret-value" not in repr(Event(type="t", stream="s", data={"password": "secret-value"}))


def test_uuid7_strictly_increasing() -> None:
    """UUIDv7 ids from one process sort in creation order."""
    ids = [uuid7() for _ in range(5000)]
    assert ids == sorted(ids) and len(set(ids)) == len(ids)
