"""Generate ``docs/configuration.md`` and the config JSON Schema from the config models.

``python -m outrelay.cli.config_doc`` (or ``outrelay config docs -o docs/configuration.md``) rewrites the
reference; ``--check`` exits 1 when the file on disk differs (the test suite runs
it). Every option of the core tables and of every built-in transport is listed
with its type, default and meaning; the meaning is the field's ``description``,
else a note of :mod:`outrelay.cli._option_notes`, else the model docstring's
``* ``name`` — meaning`` bullet, with the bounds the model enforces (a test
fails when an option has none of them). Built-in transports whose client library is missing cannot be
documented: the generator then fails with the ``pip install`` line.
"""

from __future__ import annotations

import sys
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from outrelay.cli._doc_format import bounds, bullets, default, doc, rst_to_md, type_name
from outrelay.cli._option_notes import NOTES
from outrelay.core.config.config import (
    AttemptsConfig,
    AuditConfig,
    BreakerConfig,
    BusConfig,
    ClaimCheckConfig,
    DestinationConfig,
    OutboxConfig,
    OutrelayConfig,
    RelayConfig,
    RetryPolicy,
    RouteConfig,
    config_model,
)
from outrelay.core.config.registry import Registry
from outrelay.core.contract import templates
from outrelay.plugins.crypto import CryptoConfig, CryptoRule
from outrelay.plugins.eventlog import EventLogConfig
from outrelay.plugins.otel import TracingConfig

__all__ = ["DOC_PATH", "all_models", "builtin_transports", "main", "meaning", "render", "root_model", "schema"]

DOC_PATH = Path("docs/configuration.md")

#: the tables documented, in order: the core's and the built-in plugins' sections
_CORE: list[tuple[str, type[BaseModel], str]] = [
    ("[outbox]", OutboxConfig, "Where events are stored: the outbox database."),
    ("[relay]", RelayConfig, "How the relay polls, leases, batches and drains."),
    ("[bus]", BusConfig, ""),
    ("[event_log]", EventLogConfig, "Event logs: one structured line per published event (docs/observability.md)."),
    ("[tracing]", TracingConfig, "OpenTelemetry tracing (docs/tracing.md)."),
    ("[audit]", AuditConfig, "The tamper-evident audit chain (docs/audit.md)."),
    ("[attempts]", AttemptsConfig, "The delivery-attempt log (docs/attempts.md)."),
    ("[crypto]", CryptoConfig, "Payload encryption (docs/encryption.md)."),
    ("[[crypto.rules]]", CryptoRule, "Which events are encrypted, and for which destinations."),
    ("[destinations.NAME]", DestinationConfig, ""),
    ("[destinations.NAME.retry]", RetryPolicy, ""),
    ("[destinations.NAME.breaker]", BreakerConfig, ""),
    ("[destinations.NAME.claim_check]", ClaimCheckConfig, ""),
    ("[[routes]]", RouteConfig, ""),
]


def root_model() -> type[OutrelayConfig]:
    """The config file's model with the sections of the built-in plugins (and of ``OUTRELAY_PLUGINS``),
    as :func:`~outrelay.core.config.config.config_model` builds it for them."""
    return config_model(Registry(autoload=False))


def builtin_transports() -> list[tuple[str, type[BaseModel]]]:
    """(name, config model) of every transport outrelay ships, sorted by name.

    :raises MissingExtraError: a built-in transport's client library is not installed.
    """
    registry = Registry(autoload=False)  # the built-ins only: third-party plugins document themselves
    return [(name, spec.load().Config) for name, spec in sorted(registry.transports.items())]


def all_models() -> list[type[BaseModel]]:
    """Every model the reference documents: the core tables, each transport and their sub-tables."""
    models: list[type[BaseModel]] = [root_model()] + [m for _, m, _ in _CORE]
    models += [m for _, m in builtin_transports()]
    for m in list(models):
        models += [sub for f in m.model_fields.values() if (sub := _nested(f.annotation)) and sub not in models]
    return list(dict.fromkeys(models))


def meaning(model: type[BaseModel], name: str) -> str:
    """What option ``name`` of ``model`` means: its description, else a note, else a docstring bullet."""
    field = model.model_fields[name]
    for klass in model.__mro__:
        note = NOTES.get(klass.__name__, {}).get(name)
        if note:
            break
    text = field.description or note or bullets(model.__doc__ or "").get(name, "")
    text = " ".join(text.split()).replace("``", "`").replace("|", "\\|")
    return text[:1].upper() + text[1:]


def _nested(annotation: Any) -> type[BaseModel] | None:
    """The config model inside ``annotation`` (``StreamSpec | None``), if any."""
    for arg in (annotation, *typing.get_args(annotation)):
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _table(model: type[BaseModel], skip: tuple[str, ...] = ()) -> Iterator[str]:
    yield "| option | type | default | meaning |"
    yield "|---|---|---|---|"
    for name, field in model.model_fields.items():
        if name in skip:
            continue
        text = meaning(model, name) or "See the notes above."
        yield f"| `{name}` | {type_name(field.annotation)} | {default(field)} | {text}{bounds(field)} |"


def _subtables(model: type[BaseModel], prefix: str) -> Iterator[str]:
    """A section per option that is itself a table (``[destinations.NAME.create_stream]``)."""
    for name, field in model.model_fields.items():
        sub = _nested(field.annotation)
        if sub is not None:
            yield f"### `[{prefix}.{name}]`"
            yield ""
            if sub.__doc__:
                yield rst_to_md(doc(sub))
                yield ""
            yield from _table(sub)
            yield ""


def render() -> str:
    """The whole reference, deterministic for a given set of models."""
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by `python -m outrelay.cli.config_doc` (or `outrelay config docs -o PATH`) from the",
        "     config models; do not edit by hand: tests/cli/test_config_doc.py fails when this file is stale -->",
        "",
        "outrelay reads one TOML file: `--config FILE`, else `$OUTRELAY_CONFIG`, else `./outrelay.toml`.",
        "Any string may use `${VAR}` or `${VAR:-default}` (environment variables). Unknown keys are errors.",
        "`outrelay check` validates a file and probes every destination; `outrelay config schema` prints a JSON",
        "Schema for editor completion.",
        "",
        rst_to_md(doc(sys.modules[OutrelayConfig.__module__])),
        "",
        "## Templates",
        "",
        "Options described as *a template* are rendered per event. "
        + rst_to_md(doc(templates)).split("\n\n", 1)[1].replace("\n", " "),
        "",
        "## Top level",
        "",
        *_table(root_model(), skip=("outbox", "relay", "bus", "destinations", "routes")),
        "",
    ]
    for title, model, intro in _CORE:
        out += [f"## `{title}`", ""]
        text = intro or rst_to_md(doc(model))
        if text:
            out += [text, ""]
        skip = ("retry", "breaker", "claim_check") if model is DestinationConfig else ()
        out += [*_table(model, skip=skip), ""]
        if model is DestinationConfig:
            out += [
                "Every other key of the table is an option of the destination's transport (below).",
                "",
            ]
    out += ["# Transports", ""]
    for name, model in builtin_transports():
        out += [f'## `transport = "{name}"`', ""]
        module_doc = doc(sys.modules[model.__module__])
        if module_doc:
            out += [rst_to_md(module_doc), ""]
        class_doc = doc(model)
        if class_doc and class_doc != module_doc:
            out += [rst_to_md(class_doc), ""]
        out += [*_table(model), ""]
        out += list(_subtables(model, "destinations.NAME"))
    return "\n".join(out).rstrip() + "\n"


def _describe(node: dict[str, Any], model: type[BaseModel]) -> None:
    """Give each property of a model's schema its meaning (editors show it on hover)."""
    for name, prop in node.get("properties", {}).items():
        if name in model.model_fields and "description" not in prop and meaning(model, name):
            prop["description"] = meaning(model, name)


def schema() -> dict[str, Any]:
    """JSON Schema of the config file: the core tables, and each destination as exactly one of the
    built-in transports (common options plus that transport's own)."""
    root_cls = root_model()
    root = root_cls.model_json_schema()
    defs: dict[str, Any] = root.setdefault("$defs", {})
    common = DestinationConfig.model_json_schema()
    defs.update(common.pop("$defs", {}))
    _describe(common, DestinationConfig)
    variants = []
    for name, model in builtin_transports():
        own = model.model_json_schema()
        defs.update(own.pop("$defs", {}))
        _describe(own, model)
        props = {**common["properties"], **own.get("properties", {}), "transport": {"const": name}}
        variants.append(
            {
                "title": f"{name} destination",
                "type": "object",
                "properties": props,
                "required": sorted({"transport", *own.get("required", [])}),
                "additionalProperties": False,
            }
        )
    root["properties"]["destinations"] = {"type": "object", "additionalProperties": {"oneOf": variants}}
    for model in all_models():
        if model.__name__ in defs:
            _describe(defs[model.__name__], model)
    _describe(root, root_cls)
    root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    root["title"] = "outrelay configuration"
    return root


def main(argv: list[str] | None = None) -> int:
    """``[--check] [PATH]``: write the reference to PATH (default docs/configuration.md), or with
    ``--check`` return 1 (and say so) when PATH is not up to date."""
    args = list(sys.argv[1:] if argv is None else argv)
    check = "--check" in args
    rest = [a for a in args if a != "--check"]
    path = Path(rest[0]) if rest else DOC_PATH
    text = render()
    if check:
        current = path.read_text() if path.exists() else ""
        if current != text:
            print(f"{path} is stale: run `python -m outrelay.cli.config_doc` and commit it", file=sys.stderr)
            return 1
        print(f"{path} is up to date")
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
