"""Markdown rendering helpers of :mod:`outrelay.cli.config_doc`: types, defaults, bounds, docstrings."""

from __future__ import annotations

import inspect
import re
import types
import typing
from pathlib import Path
from typing import Any

import annotated_types
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

__all__ = ["bounds", "bullets", "default", "doc", "rst_to_md", "toml", "type_name"]

_BULLET = re.compile(r"^\s*[*-] ``([a-z_]+)``((?:\s*(?:,|/|or|and)\s*``[a-z_]+``)*)\s*[—:-]+\s*(.*)$")


def type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return " \\| ".join(f'`"{a}"`' if isinstance(a, str) else f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [type_name(a) for a in args if a is not type(None)]
        return " \\| ".join(parts) + (" \\| none" if type(None) in args else "")
    if origin in (list, tuple, set, frozenset):
        inner = [a for a in args if a is not Ellipsis]
        return f"list of {type_name(inner[0])}" if inner else "list"
    if origin is dict:
        return f"table of {type_name(args[1])}" if len(args) == 2 else "table"
    if annotation is SecretStr:
        return "string (secret)"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "table"
    names = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path"}
    return names.get(annotation, getattr(annotation, "__name__", str(annotation)))


def toml(value: Any) -> str:
    if isinstance(value, BaseModel):
        return "(table)"
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(toml(v).strip("`") for v in value) + "]`"
    if isinstance(value, dict):
        return "`{}`" if not value else f"`{value}`"
    if isinstance(value, SecretStr):
        return "(secret)"
    return f"`{value}`"


def default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        return toml(field.default_factory())  # type: ignore[call-arg]
    if field.default is PydanticUndefined:
        return "**required**"
    return toml(field.default)


def bounds(field: FieldInfo) -> str:
    marks = (
        (annotated_types.Ge, "≥", "ge"),
        (annotated_types.Gt, ">", "gt"),
        (annotated_types.Le, "≤", "le"),
        (annotated_types.Lt, "<", "lt"),
    )
    out = []
    for m in field.metadata:
        for cls, sym, attr in marks:
            if isinstance(m, cls):
                out.append(f"{sym} {getattr(m, attr)}")
        if isinstance(m, annotated_types.MinLen) and m.min_length:
            out.append(f"length ≥ {m.min_length}")
        if isinstance(m, annotated_types.MaxLen):
            out.append(f"length ≤ {m.max_length}")
    return f" ({', '.join(out)})" if out else ""


def bullets(doc: str) -> dict[str, str]:
    """``* ``name`` — meaning`` bullets of a docstring (continuation lines joined)."""
    found: dict[str, str] = {}
    current: list[str] = []
    lines = inspect.cleandoc(doc).splitlines()
    for line in [*lines, ""]:
        m = _BULLET.match(line)
        if m or not line.strip() or line.lstrip().startswith(("* ", "- ")):
            if current:
                for name in current[0].split():
                    found.setdefault(name, " ".join(current[1:]).strip())
            current = []
        if m:
            names = [m.group(1), *re.findall(r"``([a-z_]+)``", m.group(2))]
            current = [" ".join(names), m.group(3).strip()]
        elif current and line.strip():
            current.append(line.strip())
    return found


def doc(obj: Any) -> str:
    return inspect.cleandoc(obj.__doc__ or "").strip()


def rst_to_md(text: str) -> str:
    """Docstrings are reST: ``x`` → `x`, ``Example::`` blocks → fenced TOML (marked as a config that
    tests/test_docs_examples.py validates), roles → code."""
    out: list[str] = []
    fence = False

    def close() -> None:
        while out and not out[-1].strip():
            out.pop()
        out.extend(["```", ""])

    for line in text.splitlines():
        if fence and line.strip() and not line.startswith("    "):
            close()
            fence = False
        if not fence and line.rstrip().endswith("::"):
            intro = line.rstrip()[:-2].rstrip()
            if intro:
                out += [intro if intro.endswith(":") else intro + ":", ""]
            out += ["<!-- docs-test: config -->", "```toml"]  # tests/test_docs_examples.py checks it
            fence = True
            continue
        if fence:
            if line.strip() or out[-1] != "```toml":
                out.append(line[4:])
        else:
            out.append(line.replace("``", "`"))
    if fence:
        close()
    md = re.sub(r":(class|meth|mod|func|data|attr):`~?([^`]+)`", r"`\2`", "\n".join(out))
    return re.sub(r"\n{3,}", "\n\n", md).strip()
