"""Fidelity checks: what goes in comes out, byte for byte and field by field.

Every event is sent through ``send()``, read back through the transport's own
reader, and compared with what was sent: the reader must return
``Received.event`` rebuilt by the transport from what was on the wire.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime

import orjson

from outrelay.conformance._harness import (
    CheckFailed,
    CheckSkipped,
    Context,
    Session,
    assert_same,
    by_id,
    check,
    diff_events,
    short,
)
from outrelay.core.contract.transport import Delivered, Received, Rejected
from outrelay.core.model import cloudevents
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError

__all__: list[str] = []

_LARGEST_SENT = 64 * 1024 * 1024
_CE_PREFIXES = ("ce-", "ce_", "cloudEvents_", "cloudEvents:", "")  # "": MQTT 5 unprefixed user properties


def binary_payload(size: int) -> bytes:
    """``size`` bytes cycling through every byte value (not valid UTF-8)."""
    block = bytes(range(256))
    return (block * (size // 256 + 1))[:size]


async def send_delivered(s: Session, events: Sequence[Event], what: str = "send()") -> None:
    results = await s.send(events, what=what)
    bad = [(e, r) for e, r in zip(events, results, strict=True) if not isinstance(r, Delivered)]
    if bad:
        e, r = bad[0]
        raise CheckFailed(f"{what}: event {e.id!r} ({len(e.data)} data bytes) was not delivered: {r!r}")


async def roundtrip(ctx: Context, events: Sequence[Event], *, sequence: bool = True) -> dict[str, Received]:
    """Send ``events`` in one batch, read them back, compare every field."""
    s = await ctx.session()
    await send_delivered(s, events)
    return assert_same(events, await s.expect(len(events)), sequence=sequence)


def max_size_or_skip(ctx: Context, s: Session) -> int:
    size = s.caps.max_message_bytes
    if size is None:
        raise CheckSkipped("transport declares no max_message_bytes")
    if size > _LARGEST_SENT:
        raise CheckSkipped(f"max_message_bytes={size} is too large to send in a conformance run")
    return size


@check
async def payload_empty(ctx: Context) -> None:
    """An event with empty data is delivered and read back with empty data."""
    await roundtrip(ctx, [ctx.event("empty-1", data=b""), ctx.event("empty-2", data=b"", content_type="text/plain")])


@check
async def payload_binary(ctx: Context) -> None:
    """Binary data that is not UTF-8 (every byte value, NULs included) round-trips byte for byte."""
    # 256 bytes: every byte value once, and within any sane max_message_bytes
    await roundtrip(ctx, [ctx.event("bin", data=binary_payload(256), content_type="application/octet-stream")])


@check
async def payload_unicode(ctx: Context) -> None:
    """Text data with non-ASCII characters (accents, CJK, emoji) round-trips as the same UTF-8 bytes."""
    text = "héllo wörld — 日本語 ✓ 🚀 \u2028 end"
    await roundtrip(ctx, [ctx.event("text", data=text), ctx.event("text-json", data={"msg": text, "n": [1, 2.5]})])


@check
async def payload_json(ctx: Context) -> None:
    """Compact JSON data round-trips byte for byte and decodes to the same value."""
    value = {"order": 42, "items": [{"sku": "A-1", "qty": 2}], "note": None, "ok": True, "price": 9.99}
    got = await roundtrip(ctx, [ev := ctx.event("json", data=value)])
    if got[ev.id].event.json() != value:
        raise CheckFailed(f"JSON data decodes to {short(got[ev.id].event.json())}, sent {short(value)}")


@check
async def payload_max_size(ctx: Context) -> None:
    """Data of exactly the declared max_message_bytes is delivered and read back intact."""
    s = await ctx.session()
    size = max_size_or_skip(ctx, s)
    ev = ctx.event("max", data=binary_payload(size), content_type="application/octet-stream")
    await send_delivered(s, [ev], what=f"send() of exactly max_message_bytes={size}")
    assert_same([ev], await s.expect(1))


@check
async def payload_over_max_rejected(ctx: Context) -> None:
    """Data one byte over max_message_bytes is Rejected (permanent) and never delivered."""
    s = await ctx.session()
    size = max_size_or_skip(ctx, s)
    big = ctx.event("over", data=binary_payload(size + 1), content_type="application/octet-stream")
    [result] = await s.send([big], what=f"send() of max_message_bytes+1={size + 1}")
    if not isinstance(result, Rejected):
        raise CheckFailed(f"a message of max_message_bytes+1={size + 1} data bytes gave {result!r}, not Rejected")
    not_disabling(result, "an oversized message")
    sentinel = ctx.event("over", data=b"after")
    await send_delivered(s, [sentinel])
    got = await s.expect(1)
    if got[0].event.id != sentinel.id:
        raise CheckFailed(f"the rejected oversized message was delivered anyway ({got[0].event!r})")
    await s.expect_nothing_more()


#: a value for each metadata key the CloudEvents mapping promotes to an attribute of its own
PROMOTED_VALUES = {
    "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
    "tracestate": "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
    "keyid": "orders-2024-05",
}


def promoted_metadata() -> dict[str, str]:
    """Every key of ``cloudevents.PROMOTED_METADATA`` with a plausible value (trace context, key id)."""
    return {k: PROMOTED_VALUES.get(k, f"promoted-{k}") for k in cloudevents.PROMOTED_METADATA}


def not_disabling(result: Rejected, what: str) -> None:
    """:raises CheckFailed: ``result`` disables the destination — one bad message must never stop all the others."""
    if result.disable_destination:
        raise CheckFailed(
            f"{what} was Rejected with disable_destination=True: the relay would stop the whole destination for one "
            "message; disable only when the destination itself is gone (e.g. HTTP 410)"
        )


@check
async def metadata_roundtrip(ctx: Context) -> None:
    """Metadata (string map passed through as headers/extensions) round-trips exactly, keys and values, including
    the keys promoted to attributes of their own (traceparent, tracestate, keyid), alone and among others."""
    promoted = promoted_metadata()
    meta = {
        "trace-id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "x.dotted.key": "v",
        "Mixed-Case": "Value With Spaces",
        "empty": "",
        "unicode": "ünïcödé ✓",
        "json-ish": '{"a": [1, 2]}',
        "long": "x" * 256,
    }
    events = [
        ctx.event("meta", data=b"m", metadata=meta),
        ctx.event("meta-none", data=b"n"),
        ctx.event("meta-promoted", data=b"p", metadata=promoted),
        ctx.event("meta-mixed", data=b"x", metadata={**promoted, "k": "v"}),
    ]
    await roundtrip(ctx, events)


@check
async def content_type(ctx: Context) -> None:
    """The content type of each event (JSON, text with charset, binary, vendor types) comes back unchanged."""
    cases: list[tuple[str, object]] = [
        ("application/json", {"a": 1}),
        ("text/plain; charset=utf-8", "plain text"),
        ("application/octet-stream", b"\x00\x01\xfe\xff"),
        ("application/vnd.outrelay.test+json", {"b": 2}),
        ("application/x-protobuf", b"\x08\x96\x01"),
        ("text/csv", "a,b\n1,2\n"),
    ]
    events = [ctx.event(f"ct-{i}", data=data, content_type=ct) for i, (ct, data) in enumerate(cases)]
    await roundtrip(ctx, events)


def full_event(ctx: Context) -> Event:
    """An event with every envelope field set to a non-default value."""
    return ctx.event(
        "order-42",
        id=f"orconf-{uuid.uuid4()}",
        source="https://example.com/outrelay/conformance",
        time=datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=UTC),
        tenant="tenant-a",
        correlation_id="corr-7f3a",
        causation_id="cause-19bd",
        event_version="3",
        schema_version="https://example.com/schemas/order/v2.json",
        producer_version="1.2.3",
        subject="orders/42",
        labels={"region": "eu-west", "tier": "gold"},
        tags=("billing", "priority"),
        content_type="application/json",
        metadata={"k": "v"},
        data={"amount": 42},
        sequence=12345,
    )


@check
async def cloudevents_envelope(ctx: Context) -> None:
    """Every envelope field (id, type, source, time, stream, tenant, ids, versions, subject, labels, tags,
    content type, metadata, sequence) round-trips, and unset optional fields come back unset."""
    await roundtrip(ctx, [full_event(ctx), ctx.event("minimal", data=b"")])


def decode_raw(r: Received) -> tuple[str, Event]:
    """Decode the raw wire form as a CloudEvents consumer would (binary or structured mode)."""
    lower = {k.lower(): v for k, v in r.headers.items()}
    for prefix in _CE_PREFIXES:
        if prefix.lower() + "id" in lower:
            if lower.get(prefix.lower() + "specversion") != "1.0":
                raise CheckFailed(f"binary-mode headers ({prefix}*) lack {prefix}specversion=1.0")
            # ce- is the HTTP and NATS bindings' prefix: their values are percent-encoded (a no-op on other values)
            percent = prefix == "ce-"
            event = cloudevents.from_binary(
                r.headers, r.body, content_type=r.content_type, prefix=prefix, percent=percent
            )
            return "binary", event
    try:
        doc = orjson.loads(r.body)
    except orjson.JSONDecodeError:
        doc = None
    if not isinstance(doc, dict) or doc.get("specversion") != "1.0":
        raise CheckFailed(
            f"the raw message is neither binary-mode CloudEvents (no ce-id/ce_id/cloudEvents_id header in "
            f"{sorted(r.headers)[:8]}) nor a structured CloudEvent with specversion 1.0 (body {short(r.body)})"
        )
    return "structured", cloudevents.from_structured(r.body)


@check
async def cloudevents_binding(ctx: Context) -> None:
    """The raw headers/body decode with the CloudEvents binding, in a declared mode, to the event that was sent."""
    events = [full_event(ctx), ctx.event("bin", data=binary_payload(64), content_type="application/octet-stream")]
    s = await ctx.session()
    await send_delivered(s, events)
    got = by_id(events, await s.expect(len(events)))
    for e in events:
        try:
            mode, decoded = decode_raw(got[e.id])
        except EventError as exc:
            raise CheckFailed(f"event {e.id!r}: the raw message is not a valid CloudEvent: {exc}") from exc
        if mode not in s.caps.cloudevents_modes:
            raise CheckFailed(f"event {e.id!r} arrived in {mode} mode; capabilities declare {s.caps.cloudevents_modes}")
        problems = diff_events(e, decoded)
        if problems:
            raise CheckFailed(f"event {e.id!r} decoded from its raw {mode}-mode form differs: " + "; ".join(problems))


@check
async def unicode_attributes(ctx: Context) -> None:
    """Non-ASCII stream, subject, tenant, labels and metadata round-trip exactly."""
    ev = ctx.event(
        "strömé/ключ-42 ✓",
        subject="sübject ✓",
        tenant="tenänt",
        correlation_id="körr-1",
        labels={"etikett": "wërt"},
        metadata={"ключ": "значение", "emoji": "🚀"},
        data=b"u",
    )
    await roundtrip(ctx, [ev])


@check
async def event_id(ctx: Context) -> None:
    """Event ids of every allowed shape (UUIDv7, 200 characters, punctuation) come back as sent."""
    ids = [None, "order-42:created", "a" * 200, "ID_with.dots~and-dashes", "7", "evt/1#a%20b+c=d&e"]
    events = [ctx.event(f"id-{i}", data=b"i", **({"id": v} if v else {})) for i, v in enumerate(ids)]
    await roundtrip(ctx, events)


@check
async def ordering_key(ctx: Context) -> None:
    """The ordering key the reader reports (Received.key) is the event's stream."""
    s = await ctx.session()
    if not s.caps.ordering_by_key:
        raise CheckSkipped("transport declares no ordering by key (capabilities.ordering_by_key is false)")
    streams = ["k1", "workflow-9f3c2a", "tenant-a/order-42", "UPPER.lower_mixed-1", "x" * 200]
    events = [ctx.event(st, data=b"k") for st in streams]
    await send_delivered(s, events)
    got = by_id(events, await s.expect(len(events)))
    for e in events:
        if got[e.id].key != e.stream:
            raise CheckFailed(f"event {e.id!r} of stream {short(e.stream)} was read with key {short(got[e.id].key)}")
