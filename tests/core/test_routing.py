"""Routing and target templates."""

from __future__ import annotations

import pytest

from outrelay import ConfigError, Event, RouteConfig
from outrelay.core.contract.templates import Template
from outrelay.core.relay.routing import Router


class TestRouter:
    def test_no_routes_means_everywhere(self) -> None:
        """Without routes every event goes to every destination."""
        r = Router([], ["a", "b"])
        assert r(Event(type="x", stream="s")) == ["a", "b"] and r.static_destinations == ("a", "b")

    def test_filters(self) -> None:
        """Type globs, tenants, labels and tags must all match."""
        routes = [
            RouteConfig(types=("workflow.*",), tenants=("acme",), destinations=("a",)),
            RouteConfig(types=("activity.failed",), labels={"prio": "high"}, destinations=("b",)),
            RouteConfig(tags=("audit",), destinations=("a", "c")),
        ]
        r = Router(routes, ["a", "b", "c"])
        assert r(Event(type="workflow.created", stream="s", tenant="acme")) == ["a"]
        assert r(Event(type="workflow.created", stream="s", tenant="other")) == []
        assert r(Event(type="activity.failed", stream="s", labels={"prio": "high"})) == ["b"]
        assert r(Event(type="activity.failed", stream="s")) == []
        assert r(Event(type="workflow.x", stream="s", tenant="acme", tags=("audit",))) == ["a", "c"]

    def test_park_policy(self) -> None:
        """parks() is true only for a matching route to that destination with on_exhausted=park."""
        r = Router([RouteConfig(types=("a.*",), destinations=("d",), on_exhausted="park")], ["d", "e"])
        assert r.parks(Event(type="a.b", stream="s"), "d")
        assert not r.parks(Event(type="b.b", stream="s"), "d")
        assert not r.parks(Event(type="a.b", stream="s"), "e")


class TestTemplate:
    def test_render(self) -> None:
        """Placeholders render from the event; a missing tenant renders as 'default'."""
        t = Template("wovyr.{category}.{type}.{tenant}")
        assert t.render(Event(type="workflow.created", stream="s")) == "wovyr.workflow.workflow.created.default"

    @pytest.mark.parametrize("bad", ["{nope}", "{type!r}", "{type:>5}", "{"])
    def test_bad_template(self, bad: str) -> None:
        """Unknown placeholders or format specs are config errors."""
        with pytest.raises(ConfigError):
            Template(bad)


def test_template_escape_applies_to_values_only() -> None:
    """An escape function (URL quoting) changes substituted values, never the literal text."""
    from urllib.parse import quote

    t = Template("https://h/x?s={stream}", escape=lambda v: quote(v, safe=""))
    assert t.render(Event(type="t", stream="a/b?c#d")) == "https://h/x?s=a%2Fb%3Fc%23d"
