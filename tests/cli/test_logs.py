"""The relay's logs: client libraries folded into one warning per outage, structured fields on JSON lines,
and a line when SIGTERM stops it."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson

from outrelay.cli._common import setup_logging
from tests.cli.conftest import Cli, _restored_logging


def _logged(level: str) -> list[dict[str, object]]:
    """What one outrelay warning and two client libraries' reconnect errors print as JSON lines."""
    err = io.StringIO()
    with _restored_logging(), contextlib.redirect_stderr(err):
        setup_logging(level, "json")
        logging.getLogger("aiokafka.conn").error("Unable connect to node with id 1: [Errno 111] refused")
        logging.getLogger("aiormq.connection").error("Connection attempt failed")
        logging.getLogger("outrelay.relay").warning("destination bus failing", extra={"destination": "bus"})
        logging.getLogger("somelib").warning("a warning of another library")
    return [orjson.loads(line) for line in err.getvalue().splitlines()]


def test_client_library_errors_are_folded_into_the_relays_warning() -> None:
    """aiokafka's and aiormq's per-attempt ERROR records are not printed at the default level (the relay's
    one warning per outage says it), other libraries' warnings are; at --log-level debug they show as debug."""
    lines = _logged("info")
    assert [(d["logger"], d["level"]) for d in lines] == [("outrelay.relay", "warning"), ("somelib", "warning")]
    assert lines[0]["destination"] == "bus"
    debug = {d["logger"]: d["level"] for d in _logged("debug")}
    assert debug["aiokafka.conn"] == "debug" and debug["aiormq.connection"] == "debug"


def test_json_warning_lines_carry_their_fields(cli_here: Cli, tmp_path: Path) -> None:
    """With --log-format json, the outage warning carries destination and error, the dead-letter warning
    destination, event id, stream, type, error and attempts — as members, not only inside msg."""
    (tmp_path / "outrelay.toml").write_text(
        '[outbox]\nurl = "sqlite:///o.db"\n[relay]\ndrain_retry_bound = 0.2\npoll_interval = 0.05\n'
        '[destinations.picky]\ntransport = "memory"\nreject_types = ["bad"]\n'
        '[destinations.down]\ntransport = "memory"\ndown = true\n'
    )
    assert cli_here("emit", "-t", "bad", "-s", "s-1").returncode == 0
    proc = cli_here("run", "--drain", "--log-format", "json")
    assert proc.returncode == 1
    lines = [orjson.loads(line) for line in proc.stderr.splitlines()]
    failing = next(d for d in lines if str(d["msg"]).startswith("destination down failing"))
    assert failing["destination"] == "down" and "is down" in str(failing["error"])
    dead = next(d for d in lines if "dead-lettered" in str(d["msg"]))
    assert {k: dead[k] for k in ("destination", "stream", "event_type", "attempts")} == {
        "destination": "picky",
        "stream": "s-1",
        "event_type": "bad",
        "attempts": 1,
    }
    assert str(dead["event_id"]) in str(dead["msg"]) and "rejected" in str(dead["error"])


def test_sigterm_logs_a_shutdown_line(tmp_path: Path) -> None:
    """SIGTERM to `outrelay run` logs that it is stopping (with the grace period) and a last `stopped` line
    with the run's summary; the exit code is 0."""
    (tmp_path / "outrelay.toml").write_text('[destinations.f]\ntransport = "file"\npath = "o.jsonl"\n')
    env = {k: v for k, v in os.environ.items() if k != "OUTRELAY_CONFIG"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "outrelay", "run"], cwd=tmp_path, env=env, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while "starting" not in proc.stderr.readline() and time.monotonic() < deadline:
        pass
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "SIGTERM received: stopping (in-flight batches get up to relay.shutdown_grace = 10s)" in err
    assert "outrelay stopped: delivered 0 in" in err
