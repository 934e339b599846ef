"""Pydantic validation errors as outrelay's one-line messages.

Shared by the config loader (:mod:`outrelay.core.config.config`) and the plugin
registry (a transport's options, :mod:`outrelay.core.config.registry`); it sits
below both so that neither imports the other.
"""

from __future__ import annotations

from pydantic import ValidationError

__all__ = ["format_validation_error"]


def format_validation_error(exc: ValidationError) -> str:
    """Pydantic's error as one line per problem, joined by '; ', no input values."""
    parts = []
    for err in exc.errors(include_input=False, include_url=False):
        loc = ".".join(str(p) for p in err["loc"])
        msg = err["msg"].removeprefix("Value error, ")  # pydantic's wording for our own validators' messages
        if err["type"] == "extra_forbidden":
            msg = "unknown option (check the spelling)"
        parts.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(parts)
