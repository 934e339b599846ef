"""`outrelay check`: the same refusals as `run`, --offline, and whether it created the outbox."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Cli
from tests.services import free_port

HOOK = """
[outbox]
url = "sqlite:///outbox.db"

[destinations.hooks]
transport = "webhook"
url = "http://127.0.0.1:{port}/in"
allow_private_network = true
"""


def test_empty_config_is_refused_like_run(cli: Cli, tmp_path: Path) -> None:
    """A config without destinations fails `check` exactly as `run` (exit 2, same line) and creates no outbox."""
    (tmp_path / "outrelay.toml").write_text('[outbox]\nurl = "sqlite:///outbox.db"\n')
    checked, ran = cli("check"), cli("run", "--drain")
    assert checked.returncode == ran.returncode == 2, (checked.stderr, ran.stderr)
    assert "no destinations configured" in checked.stderr and "no destinations configured" in ran.stderr
    assert len(checked.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "outbox.db").exists()


def test_offline_connects_to_nothing(cli: Cli, tmp_path: Path) -> None:
    """`check --offline` validates options of an unreachable destination without probing it or creating the
    outbox; an invalid option is a config error (exit 2), as `run` says."""
    (tmp_path / "outrelay.toml").write_text(HOOK.replace("{port}", str(free_port())))
    proc = cli("check", "--offline")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "hooks        webhook: options valid (--offline: not probed)" in proc.stdout
    assert "(--offline: not opened)" in proc.stdout and not (tmp_path / "outbox.db").exists()
    online = cli("check", "--timeout", "5")
    assert online.returncode == 1 and "FAIL  hooks" in online.stdout
    (tmp_path / "outrelay.toml").write_text(HOOK.replace("{port}", "1") + "verify_tlz = false\n")
    bad = cli("check", "--offline")
    assert bad.returncode == 2 and "verify_tlz: unknown option" in bad.stderr and bad.stdout == ""


def test_check_says_it_created_the_outbox(cli: Cli, tmp_path: Path) -> None:
    """The outbox line says when check created a new SQLite outbox, and not on the next run."""
    (tmp_path / "outrelay.toml").write_text('[destinations.f]\ntransport = "file"\npath = "out.jsonl"\n')
    first = cli("check")
    assert first.returncode == 0 and "(created: a new SQLite outbox)" in first.stdout, first.stdout
    second = cli("check")
    assert second.returncode == 0 and "created" not in second.stdout


def test_run_reports_every_invalid_destination_at_once(cli: Cli, tmp_path: Path) -> None:
    """Two invalid destinations are both named in the one error line of `run` (exit 2), in outrelay's words
    (no pydantic "Value error," prefix)."""
    (tmp_path / "outrelay.toml").write_text(
        '[destinations.a]\ntransport = "file"\npth = "x"\n\n'
        '[destinations.b]\ntransport = "redis"\nurl = "redis://u:secretpw@127.0.0.1:6379/0"\n'
    )
    proc = cli("run", "--drain")
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "destinations.a: pth: unknown option" in line and "destinations.b: url: put the password" in line
    assert "Value error" not in line and "secretpw" not in line
