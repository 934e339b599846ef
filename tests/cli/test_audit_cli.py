"""`outrelay audit` and the audit records of `run` and `enable`/`disable` on a
SQLite outbox (the PostgreSQL chain is covered by tests/stores/test_audit.py).

`outrelay run` runs as a real subprocess; the quick commands run in-process
through the CLI's own entry point (exit code, stdout and stderr as a user
sees them), which keeps these tests within their CI time budget."""

from __future__ import annotations

import os
import sqlite3
import subprocess
from pathlib import Path

import orjson
import pytest

from tests.cli.conftest import Cli
from tests.cli.test_cli import assert_one_line_error

SECRET = "audit-cli-secret-DO-NOT-PRINT-4242"
ENV = {"OUTRELAY_TEST_AUDIT_KEY": SECRET}

CONFIG = """
[outbox]
url = "sqlite:///outbox.db"

[audit]
enabled = true
hmac_key = "env:OUTRELAY_TEST_AUDIT_KEY"

[destinations.files]
transport = "file"
path = "out/{stream}.jsonl"
batch_size = BATCH
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "outrelay.toml").write_text(CONFIG.replace("BATCH", "100"))
    return tmp_path


@pytest.fixture
def cmd(project: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Cli:
    """``cmd("audit", "verify", env=ENV)``: the CLI in-process, in ``project``; a CompletedProcess back."""
    monkeypatch.chdir(project)
    monkeypatch.delenv("OUTRELAY_CONFIG", raising=False)
    monkeypatch.delenv("OUTRELAY_TEST_AUDIT_KEY", raising=False)

    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        from outrelay.cli.main import main

        saved = dict(os.environ)
        os.environ.update(env or {})
        try:
            main(list(args))
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        finally:
            os.environ.clear()
            os.environ.update(saved)
        out, err = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out, err)

    return run


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr)
    return proc


def _records(cmd: Cli) -> list[dict[str, object]]:
    out = _ok(cmd("audit", "export", env=ENV)).stdout
    return [orjson.loads(line) for line in out.splitlines()]


def test_a_relay_run_and_operator_actions_are_recorded_and_verified(cli: Cli, cmd: Cli, project: Path) -> None:
    """Appends, deliveries, operator actions and a config change at start land in a chain that
    verifies; an UPDATE made with sqlite3 makes `verify` exit 1 naming the record; the key never shows."""
    outputs = [_ok(cmd("emit", "-t", "order.created", "-s", "o-1", "-n", "5", env=ENV))]
    outputs.append(_ok(cli("run", "--drain", env=ENV)))
    outputs.append(_ok(cmd("disable", "files", "--reason", "maintenance", env=ENV)))
    outputs.append(_ok(cmd("enable", "files", env=ENV)))
    (project / "outrelay.toml").write_text(CONFIG.replace("BATCH", "7"))
    outputs.append(_ok(cli("run", "--drain", env=ENV)))
    verified = _ok(cmd("audit", "verify", env=ENV))
    assert "intact" in verified.stdout and "hashes and MACs" in verified.stdout
    outputs.append(verified)

    records = _records(cmd)
    kinds = [r["kind"] for r in records]
    assert kinds == ["relay.start", "append", "delivered", "disable", "enable", "config.change", "relay.start"]
    delivered = records[2]["details"]
    assert isinstance(delivered, dict) and delivered["count"] == 5 and delivered["destination"] == "files"
    change = records[5]["details"]
    assert isinstance(change, dict) and change["changed"] == ["destinations.files"]
    assert str(records[3]["actor"]).startswith("cli:") and str(records[0]["actor"]).startswith("relay:")

    db = sqlite3.connect(project / "outbox.db")
    db.execute('UPDATE outrelay_audit SET details = \'{"destination":"files","reason":"x"}\' WHERE seq = 4')
    db.commit()
    db.close()
    broken = cmd("audit", "verify", env=ENV)
    assert_one_line_error(broken, "record 4", code=1)
    assert "edited" in broken.stderr
    outputs.append(broken)

    for proc in outputs:
        assert SECRET not in proc.stdout + proc.stderr
    assert SECRET.encode() not in (project / "outbox.db").read_bytes()


def test_export_as_events_is_delivered_once(cli: Cli, cmd: Cli, project: Path) -> None:
    """`export --as-events` appends each record once as an audit.security event that the relay delivers."""
    _ok(cmd("disable", "files", env=ENV))
    _ok(cmd("enable", "files", env=ENV))
    first = _ok(cmd("audit", "export", "--as-events", env=ENV))
    assert "appended 2 audit.security event(s)" in first.stdout
    again = _ok(cmd("audit", "export", "--as-events", env=ENV))
    assert "appended 0" in again.stdout and "2 already exported" in again.stdout
    _ok(cli("run", "--drain", env=ENV))
    lines = (project / "out" / "outrelay.audit.jsonl").read_text().splitlines()
    docs = [orjson.loads(line) for line in lines]
    assert [d["type"] for d in docs] == ["audit.security"] * 2
    assert SECRET not in "".join(lines)


def test_verify_against_a_head_catches_a_cut_chain(cmd: Cli, project: Path) -> None:
    """`audit head` prints SEQ:HASH; after the newest record is deleted, `verify --expect-head` fails."""
    _ok(cmd("disable", "files", env=ENV))
    _ok(cmd("enable", "files", env=ENV))
    head = _ok(cmd("audit", "head", env=ENV)).stdout.strip()
    assert head.startswith("2:")
    db = sqlite3.connect(project / "outbox.db")
    db.execute("DELETE FROM outrelay_audit WHERE seq = 2")
    db.commit()
    db.close()
    _ok(cmd("audit", "verify", env=ENV))
    assert_one_line_error(cmd("audit", "verify", "--expect-head", head, env=ENV), "cut off", code=1)
    assert_one_line_error(cmd("audit", "verify", "--expect-head", "nonsense", env=ENV), "SEQ:HASH")


def test_key_problems_are_one_line_without_the_key(cmd: Cli, project: Path) -> None:
    """An unset key variable, a short key and a key pasted into the config give one line; no value is echoed."""
    assert_one_line_error(cmd("audit", "verify"), "OUTRELAY_TEST_AUDIT_KEY")
    short = cmd("enable", "files", env={"OUTRELAY_TEST_AUDIT_KEY": "tiny-key"})
    assert_one_line_error(short, "at least 16 bytes")
    assert "tiny-key" not in short.stderr
    (project / "outrelay.toml").write_text(CONFIG.replace("BATCH", "1").replace("env:OUTRELAY_TEST_AUDIT_KEY", SECRET))
    pasted = cmd("audit", "verify")
    assert_one_line_error(pasted, "env:VAR or file:/path")
    assert SECRET not in pasted.stderr + pasted.stdout
