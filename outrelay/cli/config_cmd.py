"""``outrelay config``: the configuration reference and its JSON Schema."""

from __future__ import annotations

from pathlib import Path

import orjson
import typer

from outrelay.cli import config_doc
from outrelay.cli._common import console, err_console

__all__ = ["app"]

app = typer.Typer(
    help="The configuration reference (docs/configuration.md) and JSON Schema, generated from the config models.",
    no_args_is_help=True,
    add_completion=False,
)


@app.command("schema")
def schema(
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to this file instead of stdout."),
) -> None:
    """Print the JSON Schema of outrelay.toml (for editor completion and validation)."""
    text = orjson.dumps(config_doc.schema(), option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS).decode() + "\n"
    if output is None:
        print(text, end="")
    else:
        output.write_text(text)
        console.print(f"wrote {output}", markup=False)


@app.command("docs")
def docs(
    output: Path = typer.Option(config_doc.DOC_PATH, "--output", "-o", help="The Markdown file to write."),
    check: bool = typer.Option(False, "--check", help="Write nothing; exit 1 if the file is not up to date."),
) -> None:
    """Generate the configuration reference: every option of the core and of each built-in transport."""
    text = config_doc.render()
    if check:
        current = output.read_text() if output.exists() else ""
        if current != text:
            err_console.print(
                f"outrelay: error: {output} is stale: run `outrelay config docs` and commit it", markup=False
            )
            raise typer.Exit(1)
        console.print(f"{output} is up to date", markup=False)
        return
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text)
    console.print(f"wrote {output}", markup=False)
