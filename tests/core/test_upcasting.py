"""Upcasters: chains per (type, version), the pluggy hook, and clear errors."""

from __future__ import annotations

from typing import Any

import pytest

from outrelay import Event
from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.config.registry import Registry
from outrelay.core.history.upcasting import Upcasters, upcast
from outrelay.core.model.errors import EventError


def v1(data: Any = None, type: str = "order.placed", version: str = "1") -> Event:
    return Event(type=type, stream="o-1", data=data or {"amount": 5}, event_version=version, sequence=7)


def test_chain_brings_old_versions_to_the_newest() -> None:
    """v1 goes through 1->2 and 2->3; v2 through 2->3; v3 and other types are returned as they are."""
    up = Upcasters()
    up.register("order.placed", "2", lambda d: {**d, "v3": True})
    up.register("order.placed", 1, lambda d: {"total": d["amount"]})
    assert up.current == {"order.placed": "3"}
    old = v1()
    out = up.upcast(old)
    assert out.json() == {"total": 5, "v3": True} and out.event_version == "3"
    assert (out.id, out.sequence, out.time) == (old.id, 7, old.time)  # only data and version change
    current = v1({"total": 1}, version="3")
    assert up.upcast(current) is current
    other = v1(type="user.created")
    assert up.upcast(other) is other


def test_decorator_and_explicit_target_version() -> None:
    """The decorator registers a step; to_version= allows non-numeric versions."""
    up = Upcasters()

    @up.upcaster("t", "alpha", to_version="beta")
    def step(d: Any) -> Any:
        return {"x": d["x"] * 2}

    assert up.upcast(v1({"x": 2}, type="t", version="alpha")).json() == {"x": 4}


def test_gap_in_the_chain_names_type_and_versions() -> None:
    """A version with no step towards the current one raises EventError naming the type and both versions."""
    up = Upcasters()
    up.register("order.placed", "2", lambda d: d)
    with pytest.raises(EventError, match=r"'order.placed' is at version 1 and no upcaster goes from 1 towards 3"):
        up.upcast(v1())


def test_duplicate_step_and_failing_upcaster_are_event_errors() -> None:
    """Registering a step twice, or an upcaster raising, is one EventError line naming the step."""
    up = Upcasters()
    up.register("order.placed", "1", lambda d: d["missing"])
    with pytest.raises(EventError, match="registered twice"):
        up.register("order.placed", "1", lambda d: d)
    with pytest.raises(EventError, match=r"'order.placed' 1 -> 2 failed on event .*'missing'"):
        up.upcast(v1())


def test_plugins_register_upcasters_through_the_hook() -> None:
    """An outrelay_add_upcasters hook implementation adds its steps to the registry."""

    class Plugin:
        @hookimpl
        def outrelay_add_upcasters(self, registry: Upcasters) -> None:
            registry.register("order.placed", "1", lambda d: {"total": d["amount"]})

    reg = Registry(autoload=False)
    reg.pm.register(Plugin())
    up = Upcasters().load_plugins(reg)
    assert up.upcast(v1()).json() == {"total": 5}


def test_module_upcast_without_upcasters_is_identity() -> None:
    """upcast() on a type nobody upcasts returns the very same event."""
    e = v1(type="never.upcast.type")
    assert upcast(e) is e


@pytest.mark.parametrize("version", ["1", "12", 'a"b', "ü\\"])
def test_version_of_reads_the_stored_envelope(version: str) -> None:
    """version_of finds event_version in a stored envelope, escaped characters included."""
    import orjson

    from outrelay.core.history.lean import version_of

    attrs = orjson.dumps(v1(version=version).attributes())
    assert version_of(attrs) == version
    assert version_of(attrs.decode()) == version
