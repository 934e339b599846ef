"""CloudEvents protocol bindings a transport can declare, and the rules the suite holds them to.

A :class:`Binding` says how a transport puts an event on the wire in binary
mode: the attribute prefix of its headers/properties (``""`` for MQTT's
unprefixed user properties), whether header values are percent-encoded (the
HTTP binding, section 3.1.3.2), which protocol field carries
``datacontenttype``, or that it only sends structured mode. The binding
checks (:mod:`outrelay.conformance._checks_binding`) validate the raw
messages a reader returns against it, and decode them with the CloudEvents
SDK where the SDK has that binding (:attr:`Binding.sdk`).

Use a ready-made one (:data:`HTTP`, :data:`KAFKA`, :data:`AMQP`, :data:`MQTT`,
:data:`NATS`, :data:`STRUCTURED`) or build your own::

    ConformanceTarget(make_transport=..., binding=Binding("redis", prefix="ce_"))
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from urllib.parse import unquote

__all__ = ["AMQP", "HTTP", "KAFKA", "MQTT", "NATS", "STRUCTURED", "Binding", "attribute_headers", "header_problems"]

#: CloudEvents attribute names: lower-case letters and digits only (spec 1.0, "Attribute Naming Convention")
ATTRIBUTE_NAME = re.compile(r"[a-z0-9]+")
#: what a percent-encoded HTTP header value may hold: printable ASCII but space, '"' and '%', plus %XX escapes
_PERCENT_SAFE = re.compile(r"(?:[\x21\x23-\x24\x26-\x7e]|%[0-9A-Fa-f]{2})*")
REQUIRED = ("id", "source", "specversion", "type")


@dataclasses.dataclass(frozen=True)
class Binding:
    """A CloudEvents protocol binding as one transport implements it.

    * ``name`` — the protocol (``http``, ``kafka``, ``amqp``, ``mqtt``, ``nats``, or your own), shown in messages.
    * ``prefix`` — the binary-mode attribute prefix (``ce-``, ``ce_``, ``cloudEvents_``, ``cloudEvents:``),
      matched case-insensitively; ``""``: every header that is not ``content_type_header`` is an attribute
      (MQTT 5 user properties).
    * ``percent_encoded`` — attribute values are percent-encoded UTF-8 (HTTP binding 3.1.3.2): only printable
      ASCII except space, ``"`` and ``%`` appear, the rest as ``%XX``.
    * ``content_type_header`` — the header/property that carries ``datacontenttype`` in binary mode (it must
      not also appear as ``<prefix>datacontenttype``); ``None``: the attribute travels with the others.
    * ``structured_only`` — the transport sends structured mode (``application/cloudevents+json``) only.
    * ``sdk`` — the CloudEvents SDK binding (``http``, ``kafka``, ``amqp``) that must decode the message;
      ``None``: no SDK decoding, the rules alone.
    """

    name: str
    prefix: str = "ce-"
    percent_encoded: bool = False
    content_type_header: str | None = "content-type"
    structured_only: bool = False
    sdk: str | None = None

    def __post_init__(self) -> None:
        if self.sdk not in (None, "http", "kafka", "amqp"):
            raise ValueError(f"Binding.sdk={self.sdk!r}: the CloudEvents SDK has bindings http, kafka and amqp only")


HTTP = Binding("http", prefix="ce-", percent_encoded=True, sdk="http")
KAFKA = Binding("kafka", prefix="ce_", sdk="kafka")
AMQP = Binding("amqp", prefix="cloudEvents_", sdk="amqp")
MQTT = Binding("mqtt", prefix="", content_type_header="content-type")
#: NATS has no content-type field of its own: ``ce-datacontenttype`` is a header (``Content-Type`` may repeat it)
NATS = Binding("nats", prefix="ce-", percent_encoded=True, content_type_header=None)
STRUCTURED = Binding("structured", structured_only=True)


def attribute_headers(binding: Binding, headers: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Attribute name (lower case) -> (header name as sent, raw value) of the binding's attribute headers."""
    low = binding.prefix.lower()
    carrier = (binding.content_type_header or "").lower()
    out: dict[str, tuple[str, str]] = {}
    for name, value in headers.items():
        lname = name.lower()
        if low and lname.startswith(low):
            out[lname[len(low) :]] = (name, value)
        elif not low and lname != carrier:
            out[lname] = (name, value)
    return out


def decode_value(binding: Binding, raw: str) -> str:
    """The attribute value behind a raw header value (percent-decoded when the binding says so).

    :raises UnicodeDecodeError: the percent-encoded bytes are not UTF-8."""
    return unquote(raw, errors="strict") if binding.percent_encoded else raw


def header_problems(binding: Binding, headers: Mapping[str, str], want: Mapping[str, str]) -> list[str]:
    """What is wrong with binary-mode ``headers`` under ``binding``, given the attributes ``want``
    (from :func:`outrelay.core.model.cloudevents.attributes`). Empty when the headers follow the rules."""
    attrs = attribute_headers(binding, headers)
    problems = [f"required attribute {a!r} has no {binding.prefix}{a} header" for a in REQUIRED if a not in attrs]
    if binding.prefix:
        problems += [
            f"header {sent!r} does not name a valid attribute (lower-case letters and digits only)"
            for name, (sent, _) in attrs.items()
            if not ATTRIBUTE_NAME.fullmatch(name)
        ]
    if binding.content_type_header and "datacontenttype" in attrs:
        problems.append(
            f"datacontenttype travels as {attrs['datacontenttype'][0]!r}; the {binding.name} binding carries it "
            f"in {binding.content_type_header!r}"
        )
    for name, expected in want.items():
        if name == "datacontenttype" and binding.content_type_header:
            continue
        if name not in attrs:
            problems.append(f"attribute {name!r} is missing (no {binding.prefix}{name} header)")
            continue
        sent, raw = attrs[name]
        if binding.percent_encoded and not _PERCENT_SAFE.fullmatch(raw):
            bad = next((c for c in raw if not _PERCENT_SAFE.fullmatch(c) and c != "%"), "%")
            problems.append(
                f"header {sent!r} holds {bad!r} (U+{ord(bad):04X}) unencoded; the {binding.name} binding "
                "percent-encodes everything but printable ASCII other than space, '\"' and '%'"
            )
            continue
        try:
            value = decode_value(binding, raw)
        except UnicodeDecodeError:
            problems.append(f"header {sent!r} percent-decodes to invalid UTF-8")
            continue
        if value != expected:
            problems.append(f"header {sent!r} decodes to {value[:60]!r}, expected {expected[:60]!r}")
    return problems
