"""Template segments: each placeholder stays in one segment; a rejected render dead-letters, never raises."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrelay import ConfigError, Event, Outbox, Relay, parse_config
from outrelay.core.contract.segments import RejectedTarget
from outrelay.core.contract.templates import Template

FAST = {"initial_delay": 0.01, "max_delay": 0.05, "jitter": 0.0}


@pytest.mark.parametrize(
    ("segment", "source", "tenant", "stream", "expected"),
    [
        (
            "path",
            "out/{tenant}/{stream}.jsonl",
            "..",
            "../../victim/escaped",
            "out/%2E./%2E.%2F..%2Fvictim%2Fescaped.jsonl",
        ),
        ("path", "out/{stream}", "t", ".hidden", "out/%2Ehidden"),
        ("subject", "ev.{tenant}.{stream}", "acme.orders", "a b*>", "ev.acme%2Eorders.a%20b%2A%3E"),
        ("key", "ev:{tenant}:{stream}", "acme:s1", "{x}%", "ev:acme%3As1:%7Bx%7D%25"),
        ("url", "https://h.io/t/{tenant}/s/{stream}", "a/b?c", "ü.x", "https://h.io/t/a%2Fb%3Fc/s/%C3%BC%2Ex"),
        ("name", "ev.{tenant}.{stream}", "acme", "orders-1_x", "ev.acme.orders-1_x"),
    ],
)
def test_values_are_escaped_into_one_segment(
    segment: str, source: str, tenant: str, stream: str, expected: str
) -> None:
    """Each segment kind percent-encodes exactly the characters that would leave the segment."""
    t = Template(source, segment=segment)  # type: ignore[arg-type]
    assert t.render(Event(type="t", stream=stream, tenant=tenant)) == expected


def test_type_keeps_its_dots_but_not_other_separators() -> None:
    """{type} stays a dotted hierarchy in subjects and keys; its ':' and '/' are still escaped or rejected."""
    ev = Event(type="order.created", stream="s")
    assert Template("events.{type}", segment="subject").render(ev) == "events.order.created"
    assert Template("ev:{type}", segment="key").render(Event(type="a:b.c", stream="s")) == "ev:a%3Ab.c"
    assert Template("out/{type}.json", segment="path").render(Event(type="a/../x", stream="s")) == "out/a%2F..%2Fx.json"
    rejected = Template("ev.{type}", segment="name").render(Event(type="a/b", stream="s"))
    assert isinstance(rejected, RejectedTarget) and "type 'a/b'" in rejected.reason


@pytest.mark.parametrize(
    ("segment", "source", "tenant", "why"),
    [
        ("url", "https://h/api/{tenant}/events", "..", "would change the URL's path"),
        ("url", "https://h/api/{tenant}/events", ".", "would change the URL's path"),
        ("name", "ev.{tenant}", "acme.orders", "a separator of the target template"),
        ("name", "ev-{tenant}", "a b", "not allowed in this name"),
    ],
)
def test_rejections_carry_a_reason(segment: str, source: str, tenant: str, why: str) -> None:
    """A value that cannot be escaped gives a RejectedTarget (empty, unusable text) naming field and value."""
    target = Template(source, segment=segment).render(Event(type="t", stream="s", tenant=tenant))  # type: ignore[arg-type]
    assert isinstance(target, RejectedTarget) and target == ""
    assert why in target.reason and f"tenant {tenant!r}" in target.reason and source in target.reason


def test_unknown_segment_kind() -> None:
    """An unknown segment kind is a programming error caught at construction."""
    with pytest.raises(ValueError, match="unknown segment kind"):
        Template("{type}", segment="bogus")  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Template("{nope}", segment="path")


async def test_rejected_render_is_dead_lettered_with_the_reason(tmp_path: Path) -> None:
    """A webhook event whose tenant is '..' is dead-lettered with the reason, never sent; the relay keeps going."""
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "hook": {"transport": "webhook", "url": "https://127.0.0.1:9/t/{tenant}/events", "retry": FAST}
            },
        }
    )
    outbox = Outbox.open(cfg.outbox.url)
    try:
        outbox.append([Event(type="t", stream="s", tenant=".."), Event(type="t", stream="s2", tenant=".")])
        summary = await Relay(outbox, cfg).run(drain=True)
        dead = outbox.store.dead_letters()
        assert summary.dead_lettered == 2 and len(dead) == 2
        assert all("would change the URL's path" in d.reason and d.attempts == 1 for d in dead)
    finally:
        outbox.close()


async def test_file_transport_stays_in_its_directory(tmp_path: Path) -> None:
    """The issue's probe: stream '../../victim/escaped' and tenant '..' write inside the configured directory."""
    base = tmp_path / "a" / "b" / "out"
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "destinations": {"f": {"transport": "file", "path": f"{base}/{{tenant}}/{{stream}}.jsonl"}},
        }
    )
    outbox = Outbox.open(cfg.outbox.url)
    try:
        outbox.append(Event(type="t", stream="../../victim/escaped", tenant="..", data={"x": 1}))
        summary = await Relay(outbox, cfg).run(drain=True)
        assert summary.dead_lettered == 0
    finally:
        outbox.close()
    _assert_written_only_under(tmp_path, base)


def _assert_written_only_under(root: Path, base: Path) -> None:
    written = list(root.rglob("*.jsonl"))
    assert len(written) == 1 and written[0].parent.parent == base
    assert not (root / "a" / "victim").exists() and not (root / "victim").exists()
