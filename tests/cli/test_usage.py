"""CLI usage: --version, one-line usage errors with exit 2, help text, exit codes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from outrelay._version import __version__
from outrelay.cli.main import app
from tests.cli.conftest import Cli

CONFIG = """
[outbox]
url = "sqlite:///outbox.db"

[destinations.files]
transport = "file"
path = "out/{stream}.jsonl"
"""


def _commands() -> list[tuple[str, Any]]:
    """Every (path, click command) of the app, groups included."""
    out: list[tuple[str, Any]] = []

    def walk(cmd: Any, path: str) -> None:
        out.append((path, cmd))
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, f"{path} {name}")

    walk(typer.main.get_command(app), "outrelay")
    return out


def test_version(cli: Cli) -> None:
    """`outrelay --version` prints the package version and exits 0."""
    proc = cli("--version")
    assert proc.returncode == 0 and proc.stdout.strip() == f"outrelay {__version__}", proc


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("run", "--log-level", "verbose"), "'verbose' is not one of 'debug', 'info', 'warning', 'error'"),
        (("run", "--metrics-port", "70000"), "--metrics-port"),
        (("run", "--log-format", "yaml"), "'yaml' is not one of 'text', 'json'"),
        (("run", "--bogus"), "No such option: --bogus"),
        (("nosuchcommand",), "No such command 'nosuchcommand'"),
        (("emit", "--type", "t"), "Missing option '--stream'"),
        (("dlq", "list", "--limit", "0"), "--limit"),
        (("emit", "--type", "t", "--stream", "s", "--count", "x"), "--count"),
    ],
)
def test_bad_value_is_one_line_exit_2(cli: Cli, tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    """Every bad flag or value ends in one line on stderr naming it, exit 2 and no traceback."""
    (tmp_path / "outrelay.toml").write_text(CONFIG)
    proc = cli(*args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("outrelay: error: "), proc.stderr
    assert needle in lines[0] and "Traceback" not in proc.stderr and "Value error" not in proc.stderr
    assert "--help" in lines[0]  # says where to look


def test_every_option_and_argument_has_help() -> None:
    """Each option and argument of every command carries help text."""
    missing = [
        f"{path} {p.opts[0]}"
        for path, cmd in _commands()
        for p in cmd.params
        if not getattr(p, "help", None) and p.name not in ("install_completion", "show_completion")
    ]
    assert not missing, missing


def test_flags_show_no_value_metavar() -> None:
    """Every command and group answers --help (exit 0), and help never shows a `<bool>` metavar, as if a
    flag took a value. In-process (typer's runner): a process per command cost 20 s of CI for the same text;
    `test_version` and the usage-error tests run the real `python -m outrelay`."""
    runner = CliRunner()
    for path, _ in _commands():
        result = runner.invoke(app, [*path.split()[1:], "--help"], prog_name="outrelay", env={"COLUMNS": "200"})
        assert result.exit_code == 0, (path, result.output)
        assert "<bool>" not in result.output, path
        assert "--help" in result.output and "Usage: outrelay" in result.output, path


def test_exit_codes_are_documented(cli: Cli) -> None:
    """`outrelay --help` lists the exit codes 0, 1 and 2 and the README has the same table."""
    text = " ".join(cli("--help").stdout.split())
    assert "Exit codes: 0 ok; 1 runtime failure" in text and "2 usage" in text
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert "## Exit codes" in readme


def test_no_args_prints_help_and_exit_2(cli: Cli) -> None:
    """`outrelay` alone prints its help (with the command list) and exits 2, like any usage error."""
    proc = cli()
    assert proc.returncode == 2 and "Commands:" in proc.stdout and "Traceback" not in proc.stderr


def test_replay_of_unknown_stream_fails(cli: Cli, tmp_path: Path) -> None:
    """`replay -s nosuchstream` queues nothing, says there is no such stream, and exits 1."""
    (tmp_path / "outrelay.toml").write_text(CONFIG)
    assert cli("emit", "--type", "t.x", "--stream", "s1").returncode == 0
    assert cli("run", "--drain").returncode == 0
    proc = cli("replay", "--destination", "files", "--stream", "nosuchstream")
    assert proc.returncode == 1, (proc.returncode, proc.stdout, proc.stderr)
    assert "no such stream 'nosuchstream'" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    ok = cli("replay", "--destination", "files", "--stream", "s1")
    assert ok.returncode == 0 and "queued 1 event(s)" in ok.stdout, ok.stderr


def test_shell_completion_script(cli: Cli) -> None:
    """`outrelay --show-completion bash` prints a bash completion function for outrelay."""
    proc = cli("--show-completion", "bash")
    assert proc.returncode == 0 and "_outrelay_completion" in proc.stdout, proc.stderr
