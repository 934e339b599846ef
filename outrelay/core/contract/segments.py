"""Keep every template placeholder inside one segment of its target (tenant isolation).

A :class:`~outrelay.core.contract.templates.Template` built with ``segment=`` passes each
substituted value through an escaper made here, so that a hostile tenant,
stream, source or subject cannot reach another directory, URL path segment,
subject token, key part or entity name:

``path``     (file paths) ``/ \\ : %``, control characters and a leading ``.``
             are percent-encoded: ``..`` becomes ``%2E.``, one file name.
``url``      (webhook URLs) the value is percent-encoded (``quote(safe="")``)
             plus any of ``-._~`` that the template uses as a separator; a value
             made only of dots (``.``/``..``) is **rejected** (URL normalisers
             may treat ``%2E%2E`` as ``..``).
``subject``  (NATS subjects, AMQP routing keys) ``. * > %``, whitespace,
             control characters and the template's separators are percent-encoded.
``key``      (Redis keys) ``% : { }`` (``{}``: cluster hash tags), whitespace,
             control characters and the template's separators are percent-encoded.
``name``     (Kafka/Pulsar/Pub/Sub/SQS/SNS/Service Bus entity names, which have no
             escape character) a value with a character outside the entity's
             alphabet, or one of the template's separators, is **rejected**.

``{type}`` and ``{category}`` keep their dots in ``subject``/``key``/``name``/``url``
segments: a dotted type is a hierarchy by design (``events.{type}`` →
``events.order.created``), and the type's own alphabet (``A-Za-z0-9._:/-``) holds no
wildcard or whitespace; its ``/`` and ``:`` are still escaped or rejected. Put
``{type}`` last in a subject when subscribers rely on token positions.

A rejection does not raise: :meth:`Template.render` returns a
:class:`RejectedTarget` (a ``str`` whose ``reason`` says why) and the relay settles
that message as ``Rejected`` without calling the transport.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Literal
from urllib.parse import quote

__all__ = ["SEGMENTS", "RejectedTarget", "Segment", "TargetRejected", "escaper"]

Segment = Literal["path", "url", "subject", "key", "name"]
SEGMENTS: tuple[str, ...] = ("path", "url", "subject", "key", "name")

_CONTROL = r"\x00-\x1f\x7f-\x9f"
_TYPE_FIELDS = frozenset({"type", "category"})

#: (field, value) -> the escaped value; raises TargetRejected
Escaper = Callable[[str, str], str]


class TargetRejected(Exception):
    """Internal: a value cannot stay in its segment (caught by Template.render)."""


class RejectedTarget(str):
    """A rendered target that must not be used: ``reason`` names the field and why.

    Its text is empty, which no transport accepts as a target, so even a caller
    that ignores the marker cannot publish the escaped value anywhere.
    """

    reason: str

    def __new__(cls, reason: str) -> RejectedTarget:
        self = super().__new__(cls, "")
        self.reason = reason
        return self

    def __repr__(self) -> str:
        return f"RejectedTarget({self.reason!r})"


def _pct(match: re.Match[str]) -> str:
    return "".join(f"%{b:02X}" for b in match.group().encode("utf-8", "surrogatepass"))


def _separators(literals: str) -> str:
    """The non-alphanumeric characters the template's literal text uses (its separators)."""
    return "".join(sorted({c for c in literals if not c.isalnum()}))


def _encoding(always: str, seps: str, *, type_dots: bool) -> Escaper:
    """An escaper percent-encoding ``always`` + ``seps``; type fields keep their dots if ``type_dots``."""
    chars = set(always) | set(seps)
    other = re.compile("[" + re.escape("".join(sorted(chars))) + _CONTROL + r"\s]")
    typed = re.compile("[" + re.escape("".join(sorted(chars - {"."} if type_dots else chars))) + _CONTROL + r"\s]")

    def escape(field: str, value: str) -> str:
        bad = typed if field in _TYPE_FIELDS else other
        return bad.sub(_pct, value) if bad.search(value) else value

    return escape


def _path(seps: str) -> Escaper:
    bad = re.compile(r"^\.|[/\\:%" + _CONTROL + "]")

    def escape(field: str, value: str) -> str:
        return bad.sub(_pct, value) if bad.search(value) else value

    return escape


def _url(seps: str) -> Escaper:
    extra = "".join(c for c in seps if c in "-._~")
    other = re.compile("[" + re.escape(extra) + "]") if extra else None
    typed = re.compile("[" + re.escape(extra.replace(".", "")) + "]") if extra.replace(".", "") else None

    def escape(field: str, value: str) -> str:
        if not value.strip("."):
            raise TargetRejected(f"{field} {value!r} would change the URL's path (a '.' or '..' segment)")
        text = quote(value, safe="", errors="surrogatepass")
        bad = typed if field in _TYPE_FIELDS else other
        return bad.sub(_pct, text) if bad is not None else text

    return escape


def _name(seps: str, alphabet: str) -> Escaper:
    ok = re.compile(f"[{alphabet}]+")
    sep_set = set(seps)

    def escape(field: str, value: str) -> str:
        if not ok.fullmatch(value):
            raise TargetRejected(f"{field} {value!r} has characters not allowed in this name (allowed: {alphabet})")
        used = sep_set - {"."} if field in _TYPE_FIELDS else sep_set
        hit = next((c for c in value if c in used), None)
        if hit is not None:
            raise TargetRejected(f"{field} {value!r} contains {hit!r}, a separator of the target template")
        return value

    return escape


#: a conservative default alphabet for ``name`` segments (Kafka's)
NAME_ALPHABET = r"A-Za-z0-9._\-"


def escaper(segment: Segment, literals: str, alphabet: str | None = None) -> Escaper:
    """The escaper for ``segment`` given the template's literal text (its separators)."""
    seps = _separators(literals)
    if segment == "path":
        return _path(seps)
    if segment == "url":
        return _url(seps)
    if segment == "subject":
        return _encoding(".*>%", seps, type_dots=True)
    if segment == "key":
        return _encoding("%:{}", seps, type_dots=True)
    if segment == "name":
        return _name(seps, alphabet or NAME_ALPHABET)
    raise ValueError(f"unknown segment kind {segment!r}; use one of {', '.join(SEGMENTS)}")
