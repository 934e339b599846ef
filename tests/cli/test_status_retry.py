"""`outrelay status` at 80 columns, parked vs retrying vs dead-lettered, `outrelay retry`, and why a drain stopped."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from tests.cli.conftest import Cli

LONG = "a-destination-name-longer-than-the-columns-allow-for-a-table"

CONFIG = f"""
[outbox]
url = "sqlite:///outbox.db"

[destinations.{LONG}]
transport = "file"
path = "blocked/{{stream}}.jsonl"    # "blocked" is a file, so every write fails until it is removed
[destinations.{LONG}.retry]
initial_delay = 600
max_delay = 600

[destinations.picky]
transport = "memory"
reject_types = ["bad.event"]

[[routes]]
types = ["bad.*"]
destinations = ["picky"]
on_exhausted = "park"

[[routes]]
types = ["ok.*"]
destinations = ["{LONG}"]
"""


@pytest.fixture
def stuck(cli: Cli, tmp_path: Path) -> Path:
    """An outbox with two streams waiting for a 600 s retry and one parked stream."""
    (tmp_path / "outrelay.toml").write_text(CONFIG)
    (tmp_path / "blocked").write_text("not a directory")
    assert cli("emit", "-t", "ok.x", "-s", "wf-1", "-n", "2").returncode == 0
    assert cli("emit", "-t", "ok.x", "-s", "wf-2").returncode == 0
    assert cli("emit", "-t", "bad.event", "-s", "wf-3", "-n", "2").returncode == 0
    drain = cli("run", "--drain")
    assert drain.returncode == 1, drain.stderr
    return tmp_path


def test_drain_says_why_it_stopped(cli: Cli, stuck: Path) -> None:
    """An incomplete drain names the next retry beyond drain_retry_bound, how to make it due, and parked streams."""
    drain = cli("run", "--drain")
    err = drain.stderr.strip().splitlines()[-1]
    assert drain.returncode == 1
    assert f"the next retry ({LONG}, stream wf-" in err and "beyond relay.drain_retry_bound = 30s" in err
    assert f"`outrelay retry -d {LONG}`" in err and "1 stream(s) parked" in err


def test_status_fits_80_columns(cli: Cli, stuck: Path) -> None:
    """At 80 columns every line fits but the one led by a longer name (never cut); errors are shortened to one
    line, and retrying, parked and dead-lettered are told apart."""
    proc = cli("status", env={"COLUMNS": "80"})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines if LONG not in line), lines
    head = next(line for line in lines if line.startswith(LONG))
    assert head.startswith(f"{LONG} (file) retrying: ")  # the name is whole; the state follows, shortened
    assert "retrying 2 stream(s) · parked 0 stream(s)" in proc.stdout
    assert "retrying 0 stream(s) · parked 1 stream(s)" in proc.stdout  # picky: parked is not "in retry"
    retrying = [line for line in lines if line.startswith("  stream wf-1: attempt 1, next in ")]
    assert len(retrying) == 1 and retrying[0].endswith("…") and len(retrying[0]) <= 80
    assert any(line.startswith("  stream wf-3: PARKED after 1 attempt(s) (dlq id ") for line in lines)
    assert any(line.startswith("picky (memory) parked: rejected") for line in lines)


def test_status_json_per_stream(cli: Cli, stuck: Path) -> None:
    """`status --json` lists each waiting stream with attempts, next attempt and last error, and parked heads."""
    doc = orjson.loads(cli("status", "--json").stdout)
    by = {d["destination"]: d for d in doc["destinations"]}
    waiting = {s["stream"]: s for s in by[LONG]["retrying"]}
    assert set(waiting) == {"wf-1", "wf-2"} and waiting["wf-1"]["pending"] == 2
    assert waiting["wf-1"]["attempts"] == 1 and waiting["wf-1"]["next_attempt_at"] > time.time() + 60
    assert waiting["wf-1"]["last_error"] and by[LONG]["state"].startswith("retrying: ")
    assert [p["stream"] for p in by["picky"]["parked"]] == ["wf-3"] and by["picky"]["retrying"] == []


def test_retry_makes_due_now_and_delivery_resumes(cli: Cli, stuck: Path) -> None:
    """`outrelay retry -d D -s S` makes that stream due now; once the cause is gone a drain delivers it, and the
    status no longer shows the old error for that destination."""
    (stuck / "blocked").unlink()
    one = cli("retry", "--destination", LONG, "--stream", "wf-2")
    assert one.returncode == 0 and "1 stream(s) due now" in one.stdout, one.stderr
    doc = orjson.loads(cli("status", "--json").stdout)
    waiting = {s["stream"]: s for d in doc["destinations"] for s in d["retrying"]}
    assert waiting["wf-2"]["next_attempt_at"] <= time.time() and waiting["wf-1"]["next_attempt_at"] > time.time() + 60
    assert cli("retry", "-d", LONG).returncode == 0
    drain = cli("run", "--drain")
    assert "delivered 3" in drain.stdout + drain.stderr, drain.stderr
    assert (stuck / "blocked" / "wf-1.jsonl").read_text().count("\n") == 2
    doc = orjson.loads(cli("status", "--json").stdout)
    assert {d["destination"]: d["state"] for d in doc["destinations"]}[LONG] == "ok"


def test_retry_with_nothing_waiting_fails(cli: Cli, stuck: Path) -> None:
    """`retry` where nothing waits for backoff (only a parked stream) exits 1 with one line; an unknown
    destination is a usage error (exit 2)."""
    nothing = cli("retry", "-d", "picky")
    assert nothing.returncode == 1 and "nothing waits for a retry at picky" in nothing.stderr
    assert len(nothing.stderr.strip().splitlines()) == 1
    unknown = cli("retry", "-d", "nosuch")
    assert unknown.returncode == 2 and "unknown destination 'nosuch'" in unknown.stderr
