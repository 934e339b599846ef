"""`outrelay replay` with filters: by type, tenant and time, dry runs, a rate limit, and bad input."""

from __future__ import annotations

import time
from pathlib import Path

from outrelay.core.stores.sqlite import SQLiteStore
from tests.cli.conftest import Cli

CONFIG = """
[outbox]
url = "sqlite:///outbox.db"

[destinations.files]
transport = "file"
path = "out/{stream}.jsonl"
"""


def _project(cli: Cli, tmp_path: Path) -> None:
    (tmp_path / "outrelay.toml").write_text(CONFIG)
    assert cli("emit", "-t", "order.created", "-s", "o1", "-n", "3", "--tenant", "t1", "-d", "{}").returncode == 0
    assert cli("emit", "-t", "order.paid", "-s", "o1", "--tenant", "t2").returncode == 0
    assert cli("emit", "-t", "user.created", "-s", "u1", "--tenant", "t1").returncode == 0
    assert cli("run", "--drain").returncode == 0


def _pending(tmp_path: Path) -> int:
    store = SQLiteStore(f"sqlite:///{tmp_path}/outbox.db")
    try:
        return store.status(["files"], time.time())[0].pending
    finally:
        store.close()


def test_dry_run_counts_per_type_and_changes_nothing(cli: Cli, tmp_path: Path) -> None:
    """--dry-run prints the count per type of the selection and queues nothing."""
    _project(cli, tmp_path)
    proc = cli("replay", "-d", "files", "--type", "order.*", "--tenant", "t1", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "dry run: 3 event(s)" in proc.stdout and "order.created: 3" in proc.stdout
    assert "order.paid" not in proc.stdout
    assert _pending(tmp_path) == 0


def test_filtered_replay_queues_the_selection_at_a_rate(cli: Cli, tmp_path: Path) -> None:
    """A replay by type at --rate 4 queues exactly the selected events and takes about count/rate seconds."""
    _project(cli, tmp_path)
    t = time.monotonic()
    proc = cli("replay", "-d", "files", "--type", "*.created", "--rate", "4")
    elapsed = time.monotonic() - t
    assert proc.returncode == 0 and "queued 4 event(s)" in proc.stdout, proc.stderr
    assert _pending(tmp_path) == 4
    assert elapsed >= 0.9  # 4 events at 4/s: one page, then the pacing sleep of ~1 s


def test_bad_selections_fail_in_one_line_and_queue_nothing(cli: Cli, tmp_path: Path) -> None:
    """An unknown stream, an empty time range, or a bad time is one error line, a non-zero exit, nothing queued."""
    _project(cli, tmp_path)
    for args, words in [
        (("--stream", "nope", "--dry-run"), "no events in the outbox match stream 'nope'"),
        (("--since", "2030-01-01T00:00:00Z", "--until", "2020-01-01T00:00:00Z"), "is empty"),
        (("--since", "2099-01-01T00:00:00Z"), "no events in the outbox match"),
        (("--since", "yesterday"), "is not an ISO 8601 time"),
    ]:
        proc = cli("replay", "-d", "files", *args)
        assert proc.returncode != 0 and words in proc.stderr, (args, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert _pending(tmp_path) == 0
