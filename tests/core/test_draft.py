"""Drafts: frozen slotted objects built with plain attribute stores, then sealed."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from outrelay import Event
from outrelay.core.model._draft import _copier, drafting


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    x: int
    y: int


class TestDrafting:
    def test_sealed_draft_is_the_frozen_class(self) -> None:
        """A sealed draft is an instance of the class, equal to one built by its constructor, and frozen."""
        new, seal = drafting(Point)
        d = new()
        d.x, d.y = 1, 2
        p = seal(d)
        assert type(p) is Point and p == Point(1, 2) and hash(p) == hash(Point(1, 2))
        with pytest.raises(dataclasses.FrozenInstanceError):
            p.x = 3  # type: ignore[misc]

    def test_copier_gives_the_same_object(self) -> None:
        """The fallback seal (slot by slot, for interpreters without __class__ assignment) gives an equal object."""
        new, _ = drafting(Point)
        d = new()
        d.x, d.y = 1, 2
        p = _copier(Point, Point.__slots__)(d)
        assert type(p) is Point and p == Point(1, 2)

    def test_unslotted_class_has_no_draft(self) -> None:
        """Only slotted classes have drafts."""

        class Plain:
            pass

        with pytest.raises(TypeError, match="not a slotted class"):
            drafting(Plain)


class TestLeanEvents:
    def test_from_attributes_and_with_sequence_round_trip(self) -> None:
        """Events rebuilt from stored attributes and copied with a sequence equal the original, field by field."""
        e = Event(
            type="order.paid", stream="o-1", data={"n": 1}, tenant="acme", correlation_id="c", causation_id="k",
            event_version="3", schema_version="s", producer_version="p", subject="sub", labels={"a": "b"},
            tags=("t",), metadata={"m": "v"}, time=datetime(2026, 5, 1, 12, tzinfo=UTC),
        )  # fmt: skip
        back = Event.from_attributes(e.attributes(), e.data, 9)
        assert type(back) is Event and back == e.with_sequence(9) and back.sequence == 9
        assert {f.name: getattr(back, f.name) for f in dataclasses.fields(Event) if f.name != "sequence"} == {
            f.name: getattr(e, f.name) for f in dataclasses.fields(Event) if f.name != "sequence"
        }
        assert back.time_text == e.time_text == "2026-05-01T12:00:00Z"

    def test_checked_time_text_rendered_on_read(self) -> None:
        """A decoded event's time text is rendered from its time when first read."""
        e = Event.checked({"type": "t", "stream": "s", "time": "2026-05-01T14:30:15.5+02:00"}, b"")
        assert e.time == datetime(2026, 5, 1, 12, 30, 15, 500000, tzinfo=UTC)
        assert e.time_text == "2026-05-01T12:30:15.500000Z"
