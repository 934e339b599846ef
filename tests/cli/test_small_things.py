"""Smaller operator papercuts: `transports` shows subscriptions, the demo's hints work after it exits,
`dlq show --consumer NAME`, `dlq purge` without a terminal, `audit export | head`."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest

from outrelay import Event, Outbox, parse_config
from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetters
from outrelay.core.history import audit
from outrelay.core.model import cloudevents
from tests.cli.conftest import Cli


def test_transports_lists_subscriptions(cli_here: Cli) -> None:
    """`transports` shows the subscriptions capability `tail` asks for — also of transports whose config has
    required options (kafka) — in text and JSON."""
    text = cli_here("transports").stdout
    kafka = next(line for line in text.splitlines() if line.startswith("kafka "))
    assert "subscriptions" in kafka and "depends on config" not in kafka
    assert "subscriptions" not in next(line for line in text.splitlines() if line.startswith("webhook "))
    caps = {d["name"]: d["capabilities"] for d in orjson.loads(cli_here("transports", "--json").stdout)}
    assert caps["redis"]["subscriptions"] is True and caps["sqs"]["subscriptions"] is False


def test_demo_hints_work_after_it_exits(cli_here: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's `next:` lines name the command as it was invoked (a venv's outrelay by its path, so no
    activated venv is assumed) and suggest nothing that needs its receiver, which has stopped."""
    monkeypatch.setattr(sys, "argv", ["/opt/app/.venv/bin/outrelay", "demo"])
    proc = cli_here("demo", "-n", "6", "--streams", "2", "--dir", str(tmp_path / "d"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    hints = proc.stdout.split("next:", 1)[1]
    assert f"/opt/app/.venv/bin/outrelay status -c {tmp_path}/d/outrelay.toml" in hints
    assert f"/opt/app/.venv/bin/outrelay demo --dir {tmp_path}/d" in hints and "outrelay emit" not in hints


def test_dlq_show_consumer_takes_a_name(cli_here: Cli, tmp_path: Path) -> None:
    """`dlq show ID --consumer NAME` takes a name like the other dlq commands: the owner's name (or `all`)
    shows it, another name is one line saying whose it is (exit 1)."""
    (tmp_path / "outrelay.toml").write_text('[outbox]\nurl = "sqlite:///o.db"\n')
    dlq = ConsumerDeadLetters(f"sqlite:///{tmp_path}/o.db")
    e = Event(type="order.paid", stream="o-1")
    dl = dlq.record(consumer="billing", member="m1", event_id=e.id, type=e.type, stream=e.stream, tenant=None,
                    body=cloudevents.to_structured(e), content_type=None, reason="boom", attempts=5,
                    first_failed_at=1.0, failed_at=2.0)  # fmt: skip
    dlq.close()
    for name in ("billing", "all"):
        shown = cli_here("dlq", "show", str(dl), "--consumer", name)
        assert shown.returncode == 0 and orjson.loads(shown.stdout)["event"]["id"] == e.id
    other = cli_here("dlq", "show", str(dl), "--consumer", "shipping")
    assert other.returncode == 1 and "belongs to consumer 'billing', not 'shipping'" in other.stderr


def test_purge_without_a_terminal_names_yes(cli_here: Cli, tmp_path: Path) -> None:
    """`dlq purge --all` with stdin not a terminal exits 2 saying to add --yes, instead of `aborted`."""
    (tmp_path / "outrelay.toml").write_text('[destinations.f]\ntransport = "file"\npath = "o.jsonl"\n')
    assert cli_here("migrate").returncode == 0
    proc = cli_here("dlq", "purge", "--all")
    assert proc.returncode == 2 and "stdin is not a terminal: add --yes (-y)" in proc.stderr, proc.stderr
    assert cli_here("dlq", "purge", "--all", "-y").returncode == 0


def test_audit_export_into_head_is_not_an_error(tmp_path: Path) -> None:
    """`outrelay audit export | head -c 100` ends quietly: no broken-pipe error line, exit 0."""
    (tmp_path / "outrelay.toml").write_text(
        '[audit]\nenabled = true\n[destinations.f]\ntransport = "file"\npath = "o.jsonl"\n'
    )
    cfg = parse_config({"audit": {"enabled": True}, "outbox": {"url": f"sqlite:///{tmp_path}/outbox.db"}})
    with Outbox.open(cfg.outbox.url) as outbox:
        for i in range(600):  # ~150 KB of JSON lines: more than a pipe holds
            audit.record_action(outbox.store, cfg, "enable", {"destination": "f", "n": i, "pad": "x" * 100}, 1.0 + i)
    env = {k: v for k, v in os.environ.items() if k != "OUTRELAY_CONFIG"}
    started = time.monotonic()
    proc = subprocess.run(
        f"{sys.executable} -m outrelay audit export 2>err.txt | head -c 100 >/dev/null; cat err.txt",
        shell=True,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout
    assert time.monotonic() - started < 30
