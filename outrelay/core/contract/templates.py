"""Target templates such as ``"wovyr.{type}"`` or ``"events.{tenant}.{stream}"``.

Placeholders: ``{type}``, ``{category}`` (the type up to its first dot),
``{stream}``, ``{tenant}``, ``{source}``, ``{subject}``; a missing optional
value renders as ``default``. Templates are checked once, at config load.

Each transport keeps every substituted value inside one segment of its target
(a path component, URL path segment, subject token, key part or entity name):
characters that would leave it are percent-encoded, or the event is
dead-lettered with the reason (tenant isolation; see ``docs/transports.md``).
"""

from __future__ import annotations

import string
from collections.abc import Callable

from outrelay.core.contract.segments import RejectedTarget, Segment, TargetRejected, escaper
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError

__all__ = ["FIELDS", "RejectedTarget", "Template"]

FIELDS = frozenset({"type", "category", "stream", "tenant", "source", "subject"})


class Template:
    """A compiled target template; :meth:`render` never raises after init."""

    __slots__ = ("_escape", "_parts", "_segment", "segment", "source")

    def __init__(
        self,
        source: str,
        *,
        where: str | None = None,
        escape: Callable[[str], str] | None = None,
        segment: Segment | None = None,
        alphabet: str | None = None,
    ) -> None:
        """``escape`` is applied to every substituted value, never to the template's
        literal text. ``segment`` (path/url/subject/key/name) confines each value to
        one segment; ``alphabet`` is the regex character class a ``name`` allows."""
        self.source = source
        self._escape = escape
        self.segment = segment
        parts: list[tuple[str, str | None]] = []
        try:
            parsed = list(string.Formatter().parse(source))
        except ValueError as exc:
            raise ConfigError(f"template {source!r} is malformed: {exc}", where=where) from exc
        for literal, field, spec, conv in parsed:
            if field is not None and (field not in FIELDS or spec or conv):
                raise ConfigError(
                    f"template {source!r} uses {{{field}}}; allowed: "
                    + ", ".join("{" + f + "}" for f in sorted(FIELDS)),
                    where=where,
                )
            parts.append((literal, field))
        self._parts = tuple(parts)
        literals = "".join(lit for lit, _ in parts)
        self._segment = escaper(segment, literals, alphabet) if segment else None

    @property
    def is_static(self) -> bool:
        return all(f is None for _, f in self._parts)

    def render(self, event: Event) -> str:
        """The target for ``event``; a :class:`RejectedTarget` (empty text, with a
        ``reason``) when a value cannot be kept inside its segment."""
        out: list[str] = []
        segment = self._segment
        for literal, field in self._parts:
            out.append(literal)
            if field is not None:
                if field == "category":
                    value: str | None = event.type.split(".", 1)[0]
                else:
                    value = getattr(event, field)
                text = value if value else "default"
                if segment is not None:
                    try:
                        text = segment(field, text)
                    except TargetRejected as exc:
                        return RejectedTarget(f"cannot render {self.source!r} for event {event.id}: {exc}")
                out.append(self._escape(text) if self._escape else text)
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.source!r})"
