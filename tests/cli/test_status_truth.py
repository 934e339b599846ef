"""`outrelay status` tells the truth: a destination whose transport cannot open is failing (until it opens),
the error shown is the latest one, and text cut to fit the terminal says where the whole of it is."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.cli.conftest import Cli
from tests.services import free_port

BASE = """
[outbox]
url = "sqlite:///outbox.db"
[relay]
drain_retry_bound = 0.3
poll_interval = 0.05
"""


def states(cli_here: Cli) -> dict[str, dict[str, object]]:
    proc = cli_here("status", "--json")
    assert proc.returncode == 0, proc.stderr
    return {d["destination"]: d for d in orjson.loads(proc.stdout)["destinations"]}


def test_a_destination_that_cannot_open_is_failing(cli_here: Cli, tmp_path: Path) -> None:
    """Redis on a closed port: `status` says `failing: open failed ...` (state and last_error agree, text and
    JSON); once the destination opens again the state is `ok`."""
    closed = free_port()
    (tmp_path / "outrelay.toml").write_text(
        BASE + f'[destinations.cache]\ntransport = "redis"\nurl = "redis://127.0.0.1:{closed}/0"\nstream = "s"\n'
    )
    assert cli_here("emit", "-t", "t", "-s", "s1").returncode == 0
    assert cli_here("run", "--drain").returncode == 1
    cache = states(cli_here)["cache"]
    assert str(cache["state"]).startswith("failing: open failed") and str(cache["last_error"]).startswith("open")
    text = cli_here("status", env={"COLUMNS": "80"}).stdout
    assert "cache (redis) failing: open failed" in text
    (tmp_path / "outrelay.toml").write_text(BASE + '[destinations.cache]\ntransport = "file"\npath = "o.jsonl"\n')
    assert cli_here("run", "--drain").returncode == 0
    cache = states(cli_here)["cache"]
    assert cache["state"] == "ok" and cache["last_error"] is None


def test_the_state_shows_the_latest_error(cli_here: Cli, tmp_path: Path) -> None:
    """Two streams fail one after the other with different errors: the destination's state shows the second
    (latest) error, not the error of the stream listed first (due first, failing since the outage began)."""
    (tmp_path / "outrelay.toml").write_text(
        BASE + '[destinations.f]\ntransport = "file"\npath = "blocked/{stream}.jsonl"\n'
        "[destinations.f.retry]\ninitial_delay = 600\nmax_delay = 600\njitter = 0\n"
    )
    (tmp_path / "blocked").write_text("a file where a directory should be")  # "File exists" (mkdir)
    assert cli_here("emit", "-t", "t", "-s", "wf-1").returncode == 0
    assert cli_here("run", "--drain").returncode == 1
    first = str(states(cli_here)["f"]["state"])
    assert first.startswith("retrying: ") and "File exists" in first, first
    (tmp_path / "blocked").unlink()
    (tmp_path / "blocked" / "wf-2.jsonl").mkdir(parents=True)  # IsADirectoryError for stream wf-2 only
    assert cli_here("emit", "-t", "t", "-s", "wf-2").returncode == 0
    assert cli_here("run", "--drain").returncode == 1  # wf-1 waits 600 s: only wf-2 is tried
    f = states(cli_here)["f"]
    assert {s["stream"] for s in f["retrying"]} == {"wf-1", "wf-2"}  # type: ignore[union-attr]
    assert "Is a directory" in str(f["state"]) and "File exists" not in str(f["state"]), f["state"]


def test_text_cut_to_fit_says_how_to_see_it_whole(cli_here: Cli, tmp_path: Path) -> None:
    """At 80 columns a long error is cut with an ellipsis, and the last line points at `status --json`;
    at 300 columns nothing is cut and there is no such line."""
    (tmp_path / "outrelay.toml").write_text(
        BASE + '[destinations.picky]\ntransport = "memory"\nreject_types = ["bad"]\n'
        '[[routes]]\ntypes = ["*"]\ndestinations = ["picky"]\non_exhausted = "park"\n'
    )
    assert cli_here("emit", "-t", "bad", "-s", "s").returncode == 0
    assert cli_here("run", "--drain").returncode == 1
    narrow = cli_here("status", env={"COLUMNS": "80"}).stdout.splitlines()
    assert all(len(line) <= 80 for line in narrow), narrow
    assert any(line.endswith("…") for line in narrow)
    assert narrow[-1] == "(reasons cut to fit the terminal: `outrelay status --json` shows them whole)"
    wide = cli_here("status", env={"COLUMNS": "300"}).stdout
    assert "…" not in wide and "status --json" not in wide
