"""Binding-aware CloudEvents checks: the raw messages follow the binding the transport declares.

``ConformanceTarget.binding`` (a :class:`~outrelay.conformance.Binding`) names
the prefix, percent-encoding, content-type carrier or structured-only mode;
without it these checks skip. ``binding_rules`` validates the raw headers and
body a reader returns against those rules; ``binding_sdk_decode`` decodes
them with the CloudEvents SDK's own binding (``cloudevents`` package: HTTP,
Kafka, AMQP) and compares the result with what was sent.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import orjson

from outrelay.conformance._binding import Binding, attribute_headers, header_problems
from outrelay.conformance._checks_fidelity import binary_payload, full_event, send_delivered
from outrelay.conformance._harness import CheckFailed, CheckSkipped, Context, Session, by_id, check, diff_events, short
from outrelay.core.contract.transport import Received
from outrelay.core.model import cloudevents
from outrelay.core.model.envelope import Event, is_json_content_type
from outrelay.core.model.errors import EventError

__all__: list[str] = []

#: values the percent-encoding rules bite on: non-ASCII, space, '"', '%', and a literal escape that must stay one
AWKWARD = 'ünï 日本 🚀 "q" 100% %41 end'


def _binding(ctx: Context) -> Binding:
    if ctx.ct.binding is None:
        raise ctx.no_hook("binding")
    return ctx.ct.binding


def binding_events(ctx: Context) -> list[Event]:
    """A full envelope, awkward attribute values, binary data, and a minimal event."""
    return [
        full_event(ctx),
        ctx.event("bind-awkward", data={"a": 1}, subject=AWKWARD, tenant="t ü", metadata={"m": AWKWARD}),
        ctx.event("bind-bin", data=binary_payload(64), content_type="application/octet-stream"),
        ctx.event("bind-min", data=b""),
    ]


async def _sent_and_read(ctx: Context) -> tuple[Session, list[Event], dict[str, Received]]:
    s = await ctx.session()
    events = binding_events(ctx)
    await send_delivered(s, events)
    return s, events, by_id(events, await s.expect(len(events)))


def _header(headers: dict[str, str], name: str) -> str | None:
    low = name.lower()
    return next((v for k, v in headers.items() if k.lower() == low), None)


def rule_problems(binding: Binding, e: Event, r: Received) -> list[str]:
    """How the raw message ``r`` of event ``e`` breaks ``binding``'s rules (empty: it follows them)."""
    ctype = r.content_type or (_header(r.headers, binding.content_type_header or "content-type"))
    structured = (ctype or "").split(";", 1)[0].strip().lower() == cloudevents.STRUCTURED_CONTENT_TYPE
    if binding.structured_only or (not attribute_headers(binding, r.headers) and structured):
        if not structured:
            return [f"content type is {ctype!r}, not {cloudevents.STRUCTURED_CONTENT_TYPE} (structured mode)"]
        try:
            decoded = cloudevents.from_structured(r.body)
        except EventError as exc:
            return [f"the structured body is not a CloudEvent: {exc}"]
        return [f"structured: {d}" for d in diff_events(e, decoded)]
    if binding.structured_only:
        return ["the binding is structured-only but the message carries binary-mode attributes"]
    problems = header_problems(binding, r.headers, cloudevents.attributes(e))
    if binding.content_type_header and e.content_type:
        carried = _header(r.headers, binding.content_type_header) or r.content_type
        if carried != e.content_type:
            problems.append(
                f"{binding.content_type_header} carries {carried!r}, expected datacontenttype {e.content_type!r}"
            )
    if r.body != e.data:
        problems.append(f"binary-mode body is {short(r.body)}, expected the data {short(e.data)}")
    return problems


@check
async def binding_rules(ctx: Context) -> None:
    """The raw headers/body follow the declared CloudEvents binding: attribute prefix, valid attribute names,
    percent-encoding where the binding wants it, datacontenttype in its carrier, or structured mode only."""
    binding = _binding(ctx)
    _, events, got = await _sent_and_read(ctx)
    for e in events:
        problems = rule_problems(binding, e, got[e.id])
        if problems:
            more = f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""
            raise CheckFailed(f"event {e.id!r} breaks the {binding.name} binding: " + "; ".join(problems[:4]) + more)


def sdk_decode(binding: Binding, r: Received) -> Any:
    """Decode ``r`` with the CloudEvents SDK binding ``binding.sdk`` (auto-detecting the mode)."""
    from cloudevents.core.formats.json import JSONFormat

    fmt = JSONFormat()
    if binding.sdk == "http":
        from cloudevents.core.bindings import http

        return http.from_http(http.HTTPMessage(headers=dict(r.headers), body=r.body), fmt)
    if binding.sdk == "kafka":
        from cloudevents.core.bindings import kafka

        headers = {k: v.encode() for k, v in r.headers.items()}
        if r.content_type and "content-type" not in {k.lower() for k in headers}:
            headers["content-type"] = r.content_type.encode()
        return kafka.from_kafka(kafka.KafkaMessage(headers=headers, key=r.key, value=r.body), fmt)
    from cloudevents.core.bindings import amqp

    props: dict[str, Any] = {"content-type": r.content_type} if r.content_type else {}
    return amqp.from_amqp(amqp.AMQPMessage(properties=props, application_properties=dict(r.headers),
                                           application_data=r.body), fmt)  # fmt: skip


def sdk_differences(e: Event, ce: Any) -> list[str]:
    """Differences between the event sent and the SDK's CloudEvent."""
    want = cloudevents.attributes(e)
    got = dict(ce.get_attributes())
    out = []
    for name, value in want.items():
        have = got.get(name)
        if name == "time" and isinstance(have, datetime):
            if have != e.time:
                out.append(f"time: sent {e.time.isoformat()}, SDK read {have.isoformat()}")
            continue
        if have != value:
            out.append(f"{name}: sent {short(value, 50)}, SDK read {short(have, 50)}")
    data = ce.get_data()
    if data is None:
        ok = e.data == b""
    elif isinstance(data, bytes):
        ok = data == e.data
    elif isinstance(data, str) and not is_json_content_type(e.content_type):
        ok = data.encode() == e.data
    else:
        ok = data == orjson.loads(e.data)
    if not ok:
        out.append(f"data: sent {short(e.data, 50)}, SDK read {short(data, 50)}")
    return out


@check
async def binding_sdk_decode(ctx: Context) -> None:
    """The CloudEvents SDK's own binding (HTTP, Kafka or AMQP, as declared) decodes every raw message to the
    event that was sent: attributes, extensions and data."""
    binding = _binding(ctx)
    if binding.sdk is None:
        raise CheckSkipped(f"the {binding.name} binding has no CloudEvents SDK binding (http, kafka, amqp)")
    try:
        import cloudevents.core.bindings  # noqa: F401
    except ImportError:
        raise CheckSkipped("the CloudEvents SDK is not installed (pip install cloudevents)") from None
    _, events, got = await _sent_and_read(ctx)
    problems: list[str] = []
    for e in events:
        try:
            ce = sdk_decode(binding, got[e.id])
        except Exception as exc:  # the SDK's own errors: the message is not what its binding expects
            raise CheckFailed(
                f"event {e.id!r}: the CloudEvents SDK's {binding.sdk} binding cannot decode the raw message: "
                f"{type(exc).__name__}: {exc}"
            ) from exc
        problems += [f"event {e.id[-12:]!r} {d}" for d in sdk_differences(e, ce)]
    if problems:
        raise CheckFailed(f"decoded with the SDK's {binding.sdk} binding: " + "; ".join(problems[:5]))
