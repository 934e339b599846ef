"""read_lean_pages on the rows a store hands it: envelopes or versions, current or old, odd writers."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from outrelay import Event
from outrelay.core.history.lean import LeanEvent, read_lean_pages
from outrelay.core.history.upcasting import Upcasters
from outrelay.core.model.errors import EventError
from outrelay.core.stores.base import HistoryFilter

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def stored(n: int, *, type: str = "wf.step", version: str = "2", **kw: Any) -> Event:
    return Event(type=type, stream="s", data={"n": n}, time=T0, event_version=version, **kw).with_sequence(n)


class RowStore:
    """A store whose lean rows are given: (seq, type, envelope bytes or version str, data)."""

    def __init__(self, events: list[Event], rows: list[tuple[int, str, Any, bytes]]) -> None:
        self.events, self.rows, self.reads = events, rows, 0

    def history_lean(self, stream: str, *, after: int = 0, limit: int = 1000) -> list[tuple[int, str, Any, bytes]]:
        return [r for r in self.rows if r[0] > after][:limit]

    def history(self, where: HistoryFilter, *, after: int = 0, limit: int = 1000) -> list[Event]:
        self.reads += 1
        return [e for e in self.events if (e.sequence or 0) > after][:limit]


def envelope_rows(events: list[Event]) -> RowStore:
    """Rows as the SQLite store sends them: the stored envelope in place of the version."""
    return RowStore(events, [(e.sequence or 0, e.type, orjson.dumps(e.attributes()), e.data) for e in events])


def version_rows(events: list[Event]) -> RowStore:
    """Rows as the PostgreSQL store sends them: the version, no envelope."""
    return RowStore(events, [(e.sequence or 0, e.type, e.event_version, e.data) for e in events])


def v1_to_v2() -> Upcasters:
    up = Upcasters()
    up.register("wf.step", "1", lambda d: {**d, "retries": 0})
    return up


def fold(store: RowStore, page: int = 3, up: Upcasters | None = None) -> list[LeanEvent]:
    pages = read_lean_pages(store, "s", upcasters=v1_to_v2() if up is None else up, page=page)  # type: ignore[arg-type]
    return [e for p in pages for e in p]


class TestReadLeanPages:
    @pytest.mark.parametrize("rows", [envelope_rows, version_rows])
    def test_old_events_are_upcast_and_current_ones_kept(self, rows: Any) -> None:
        """v1 events come upcast to v2 and v2 events as stored, in order, from either kind of row."""
        events = [stored(i, version="1" if i % 4 == 0 else "2") for i in range(1, 11)]
        got = fold(rows(events))
        assert [e.sequence for e in got] == list(range(1, 11))
        assert [e.event_version for e in got] == ["2"] * 10
        assert [e.json() for e in got] == [{"n": i, "retries": 0} if i % 4 == 0 else {"n": i} for i in range(1, 11)]

    def test_a_label_named_event_version_is_not_taken_for_the_version(self) -> None:
        """A label key ``event_version`` holding the current version does not hide an old top-level version."""
        events = [stored(1, version="1", labels={"event_version": "2"}, metadata={"event_version": "2"})]
        (got,) = fold(envelope_rows(events))
        assert (got.event_version, got.json()) == ("2", {"n": 1, "retries": 0})

    def test_an_envelope_without_a_version_is_version_1(self) -> None:
        """An envelope another writer stored without ``event_version`` reads as version 1 and is upcast."""
        attrs = stored(1).attributes()
        del attrs["event_version"]
        store = RowStore([], [(1, "wf.step", orjson.dumps(attrs), b'{"n":1}')])
        (got,) = fold(store)
        assert (got.event_version, got.json()) == ("2", {"n": 1, "retries": 0})

    def test_a_version_that_only_starts_like_the_current_one_is_upcast(self) -> None:
        """A stored version ``2x`` is not ``2``: it needs its own upcaster, and lacking one fails clearly."""
        with pytest.raises(EventError, match=r"is at version 2x and no upcaster goes from 2x towards 2"):
            fold(envelope_rows([stored(1, version="2x")]))

    def test_types_without_upcasters_keep_the_stored_version(self) -> None:
        """An event of a type with no upcasters keeps its version (found in its envelope when asked)."""
        events = [stored(1, type="other", version="7", tenant="t")]
        (got,) = fold(envelope_rows(events))
        assert (got.event_version, got.tenant, got.to_event().attributes()) == ("7", "t", events[0].attributes())

    def test_rows_without_envelopes_read_each_page_once_when_asked(self) -> None:
        """Where a store sends versions only, asking every event of a page for its envelope reads that page
        once, and a fold that asks nothing reads none."""
        events = [stored(i, version="1" if i == 2 else "2", tenant=f"t{i}") for i in range(1, 8)]
        store = version_rows(events)
        got = fold(store, page=3)
        assert store.reads == 0
        assert [e.tenant for e in got[:3]] == ["t1", "t2", "t3"] and store.reads == 1
        assert [e.id for e in got] == [e.id for e in events] and store.reads == 3
        assert got[1].to_event().event_version == "2" and got[1].to_event().json() == {"n": 2, "retries": 0}
