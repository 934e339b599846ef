"""The generated configuration reference and the config JSON Schema."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from pydantic import BaseModel

from outrelay.cli.config_doc import all_models, builtin_transports, meaning, render
from tests.cli.conftest import Cli

DOC = Path(__file__).parents[2] / "docs" / "configuration.md"


def _is_table(model: type[BaseModel], name: str) -> bool:
    """Options that are sub-tables are documented by their own section."""
    return name in {"outbox", "relay", "bus", "destinations", "routes", "retry"} and model.__name__ in {
        "OutrelayConfig",
        "DestinationConfig",
    }


def test_reference_is_up_to_date() -> None:
    """docs/configuration.md equals what the generator renders now (`outrelay config docs -o PATH` refreshes it)."""
    stale = "docs/configuration.md is stale: run `outrelay config docs -o docs/configuration.md` and commit it"
    assert DOC.read_text() == render(), stale


def test_every_option_has_a_meaning() -> None:
    """Each option of the core tables and of every built-in transport has a meaning in the reference."""
    missing = [f"{m.__name__}.{name}" for m in all_models() for name in m.model_fields if not meaning(m, name)]
    assert not missing, f"add a Field description or a note in outrelay/cli/_option_notes.py: {missing}"


def test_reference_lists_every_transport_and_the_options_users_looked_for() -> None:
    """Each built-in transport has a section with a table row per option, including the ones issue 14 names."""
    text = DOC.read_text()
    for name, model in builtin_transports():
        section = text.split(f'## `transport = "{name}"`', 1)[1].split("\n## ", 1)[0]
        for option in model.model_fields:
            assert f"| `{option}` |" in section, (name, option)
    for needle in (
        "| `allow_private_network` |",
        "| `declare_exchange` |",
        "| `create_stream` |",
        "## `[destinations.NAME.retry]`",
        "| `drain_retry_bound` |",
    ):
        assert needle in text, needle


def test_docs_check_fails_on_a_stale_file(cli: Cli, tmp_path: Path) -> None:
    """`outrelay config docs --check` exits 1 for a stale file and 0 after `outrelay config docs` rewrote it."""
    target = tmp_path / "configuration.md"
    target.write_text("# Configuration reference\n\nan older one\n")
    stale = cli("config", "docs", "--check", "--output", str(target))
    assert stale.returncode == 1 and "is stale" in stale.stderr
    assert cli("config", "docs", "--output", str(target)).returncode == 0
    assert cli("config", "docs", "--check", "--output", str(target)).returncode == 0
    assert target.read_text() == render()


def test_schema_validates_a_config_and_rejects_a_typo(cli: Cli) -> None:
    """`outrelay config schema` prints a JSON Schema that accepts a valid config and rejects a misspelt option."""
    proc = cli("config", "schema")
    assert proc.returncode == 0, proc.stderr
    schema = orjson.loads(proc.stdout)
    variants = schema["properties"]["destinations"]["additionalProperties"]["oneOf"]
    assert {v["properties"]["transport"]["const"] for v in variants} == {n for n, _ in builtin_transports()}
    jsonschema = pytest.importorskip("jsonschema")
    good = {
        "outbox": {"url": "sqlite:///o.db"},
        "relay": {"drain_retry_bound": 5},
        "destinations": {
            "hooks": {"transport": "webhook", "url": "https://example.com/in", "retry": {"max_attempts": 3}},
            "cache": {"transport": "redis", "stream": "events:{category}"},
        },
    }
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"destinations": {"cache": {"transport": "redis", "strem": "x"}}}, schema)
