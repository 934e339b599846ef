"""Target templates such as ``"wovyr.{type}"`` or ``"events.{tenant}.{stream}"``.

Placeholders: ``{type}``, ``{category}`` (the type up to its first dot),
``{stream}``, ``{tenant}``, ``{source}``, ``{subject}``; a missing optional
value renders as ``default``. Templates are checked once, at config load.
"""

from __future__ import annotations

import string
from collections.abc import Callable

from outrelay.core.envelope import Event
from outrelay.core.errors import ConfigError

__all__ = ["FIELDS", "Template"]

FIELDS = frozenset({"type", "category", "stream", "tenant", "source", "subject"})


class Template:
    """A compiled target template; :meth:`render` never fails after init."""

    __slots__ = ("_escape", "_parts", "source")

    def __init__(self, source: str, *, where: str | None = None, escape: Callable[[str], str] | None = None) -> None:
        """``escape`` is applied to every substituted value (e.g. URL quoting),
        never to the template's literal text."""
        self.source = source
        self._escape = escape
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

    @property
    def is_static(self) -> bool:
        return all(f is None for _, f in self._parts)

    def render(self, event: Event) -> str:
        out: list[str] = []
        for literal, field in self._parts:
            out.append(literal)
            if field is not None:
                if field == "category":
                    value: str | None = event.type.split(".", 1)[0]
                else:
                    value = getattr(event, field)
                text = value if value else "default"
                out.append(self._escape(text) if self._escape else text)
        return "".join(out)

    def __repr__(self) -> str:
        return f"Template({self.source!r})"
