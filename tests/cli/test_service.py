"""`outrelay run` as a service: start-up line, JSON logs and summary, health endpoints."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson

from outrelay import parse_config
from outrelay._version import __version__
from outrelay.cli._summary import startup_line
from outrelay.core.config.registry import Registry
from outrelay.core.relay.relay import build_transports
from tests.cli.conftest import Cli
from tests.services import free_port

CONFIG = """
[outbox]
url = "sqlite:///outbox.db"

[destinations.files]
transport = "file"
path = "out/{stream}.jsonl"
"""

REFUSED = """
[destinations.hook]
transport = "webhook"
url = "http://127.0.0.1:{port}/in"
allow_private_network = true
secret = "s3cr3t-signing-key"
[destinations.hook.retry]
initial_delay = 0.01
max_attempts = 2
"""


def _json_lines(text: str) -> list[dict[str, object]]:
    """Every non-empty line parsed as JSON (fails on the first that is not)."""
    return [orjson.loads(line) for line in text.splitlines() if line.strip()]


def test_startup_line_masks_the_outbox_password() -> None:
    """The start-up line names version, outbox (password masked), destinations and transports; no secret in it."""
    cfg = parse_config(
        {
            "outbox": {"url": "postgresql://relay:hunter2secret@127.0.0.1:5432/test"},
            "destinations": {
                "files": {"transport": "file", "path": "out.jsonl"},
                "hook": {"transport": "webhook", "url": "https://example.com/in", "secret": "s3cr3t-signing-key"},
            },
        }
    )
    line = startup_line(cfg, build_transports(cfg, Registry()), "http://127.0.0.1:9464")
    assert line.startswith(f"outrelay {__version__} starting: outbox postgresql://relay:***@127.0.0.1:5432/test")
    assert "destinations: files (file), hook (webhook); transports: file, webhook" in line
    assert "/readyz on http://127.0.0.1:9464" in line
    assert "hunter2secret" not in line and "s3cr3t" not in line


def test_json_mode_drain_every_line_json(cli: Cli, tmp_path: Path) -> None:
    """With --log-format json, every stderr line is JSON (start-up, outage warning, final error) and the summary on
    stdout is one JSON object that tells dead-lettered from parked."""
    (tmp_path / "outrelay.toml").write_text(CONFIG + REFUSED.replace("{port}", str(free_port())))
    assert cli("emit", "--type", "t.x", "--stream", "s1", "-n", "2").returncode == 0
    proc = cli("run", "--drain", "--log-format", "json")
    assert proc.returncode == 1, proc.stderr
    logs = _json_lines(proc.stderr)
    assert str(logs[0]["msg"]).startswith(f"outrelay {__version__} starting: outbox sqlite:///outbox.db")
    assert any(d["level"] == "warning" and "destination hook failing" in str(d["msg"]) for d in logs), logs
    assert logs[-1]["level"] == "error" and "drain incomplete" in str(logs[-1]["msg"])
    assert "s3cr3t" not in proc.stderr
    (summary,) = _json_lines(proc.stdout)
    assert summary["delivered"] == 2 and summary["dead_lettered"] == 2 and summary["parked"] == 0
    assert summary["pending"] == 0 and summary["complete"] is False


def test_json_mode_usage_error_is_json(cli: Cli, tmp_path: Path) -> None:
    """A config error after --log-format json is one JSON line on stderr, exit 2."""
    (tmp_path / "outrelay.toml").write_text("[outbox\n")
    proc = cli("run", "--log-format", "json")
    assert proc.returncode == 2
    (line,) = _json_lines(proc.stderr)
    assert line["level"] == "error" and "invalid TOML" in str(line["msg"])


def test_run_serves_health_and_stops_on_sigterm(tmp_path: Path) -> None:
    """A running relay answers /healthz and /readyz with 200 on its metrics port, and SIGTERM ends it with exit 0
    and a JSON summary."""
    (tmp_path / "outrelay.toml").write_text(CONFIG)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "OUTRELAY_CONFIG"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "outrelay", "run", "--log-format", "json", "--metrics-port", str(port)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        ready = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2)
                if ready.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert ready is not None and ready.status_code == 200 and ready.text == "ready\n"
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).text == "ok\n"
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "/readyz on http://127.0.0.1:" in str(_json_lines(err)[0]["msg"])
    (summary,) = _json_lines(out)
    assert summary["complete"] is True and summary["pending"] == 0
