"""``outrelay new-transport NAME``: scaffold a transport plugin package.

Writes ``outrelay-NAME/`` (or ``--directory``): a ``pyproject.toml`` with the
``outrelay`` entry point, a transport module on :mod:`outrelay.kit` that works
at once against an in-process stand-in broker, and a test running the
conformance suite. The generated code passes ruff, mypy (strict) and its own
test; TODO comments mark what to replace with a real client library.

Fails in one line (ConfigError) when NAME is not a lower-case identifier or
the directory already holds files; it never overwrites anything.
"""

from __future__ import annotations

import re
from pathlib import Path
from string import Template

import typer

from outrelay.cli._common import console
from outrelay.cli._scaffold_templates import FILES
from outrelay.core.model.errors import ConfigError

__all__ = ["new_transport", "register", "scaffold"]

_NAME = re.compile(r"[a-z][a-z0-9_]{0,39}")
_CLASS = re.compile(r"[A-Z][A-Za-z0-9]{0,39}")


def class_prefix(name: str) -> str:
    """The default class-name prefix of transport ``name``: its ``_``-separated words capitalised
    (``redis_pubsub`` -> ``RedisPubsub``; ``--class-name`` gives another, e.g. ``RedisPubSub``)."""
    return "".join(p[:1].upper() + p[1:] for p in name.split("_"))


def scaffold(name: str, directory: Path, class_name: str | None = None) -> list[Path]:
    """Write the plugin package for transport ``name`` into ``directory``; returns the files written.
    Classes are ``<class_name>Transport``, ``<class_name>Config``...

    :raises ConfigError: a bad name or class name, or a non-empty ``directory``.
    """
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"transport name {name!r} must be a lower-case identifier (a-z, 0-9 and _, starting with a letter), "
            "e.g. carrier"
        )
    prefix = class_name if class_name is not None else class_prefix(name)
    if not _CLASS.fullmatch(prefix):
        raise ConfigError(
            f"--class-name {prefix!r} must be CapWords (letters and digits, a capital first), e.g. RedisPubSub"
        )
    if directory.exists() and (not directory.is_dir() or any(directory.iterdir())):
        raise ConfigError(f"{directory} already exists and is not empty; choose another --directory")
    values = {"name": name, "Name": prefix, "package": f"outrelay_{name}"}
    written = []
    for rel, text in FILES.items():
        path = directory / Template(rel).substitute(values)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(text).substitute(values), encoding="utf-8")
        written.append(path)
    return written


def new_transport(
    name: str = typer.Argument(..., help="The transport's name, e.g. carrier (a lower-case identifier)."),
    directory: Path | None = typer.Option(None, "--directory", help="Where to write it (default: ./outrelay-NAME)."),
    class_name: str | None = typer.Option(
        None, "--class-name", help="Class-name prefix, e.g. RedisPubSub (default: NAME's words capitalised)."
    ),
) -> None:
    """Scaffold a transport plugin package: pyproject with entry point, transport on outrelay.kit, conformance test."""
    target = directory if directory is not None else Path(f"outrelay-{name.replace('_', '-')}")
    files = scaffold(name, target, class_name)
    prefix = class_name or class_prefix(name)
    console.print(f"wrote {len(files)} files to {target}/ (classes {prefix}Transport, {prefix}Config...)", markup=False)
    console.print(f"next: cd {target} && pip install -e . && pytest", markup=False)


def register(app: typer.Typer) -> None:
    app.command("new-transport")(new_transport)
