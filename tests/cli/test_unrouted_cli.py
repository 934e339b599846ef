"""The README's case: an event no route matches is counted in the run summary and in `outrelay status`."""

from __future__ import annotations

from pathlib import Path

import orjson

from tests.cli.conftest import Cli


def test_cli_summary_and_status_show_unrouted(cli_here: Cli, tmp_path: Path) -> None:
    """`run --drain` says how many events went nowhere and why; `status` lists them per type (text and JSON),
    and a second run adds to the recorded counts."""
    run = cli_here
    (tmp_path / "outrelay.toml").write_text(
        '[outbox]\nurl = "sqlite:///app.db"\n[destinations.hooks]\ntransport = "file"\npath = "out.jsonl"\n'
        '[[routes]]\ntypes = ["workflow.*"]\ntenants = ["acme"]\ndestinations = ["hooks"]\n'
    )
    for _ in range(2):
        assert run("emit", "-t", "order.paid", "-s", "order-42", "-d", '{"id": 42}').returncode == 0
        drain = run("run", "--drain")
        assert drain.returncode == 0, drain.stderr
        assert "1 routed nowhere (no_route: 1; see `outrelay status`)" in drain.stdout
    status = run("status")
    assert "routed nowhere: order.paid ×2 — no [[routes]] entry matches it" in status.stdout
    doc = orjson.loads(run("status", "--json").stdout)
    assert doc["unrouted_events"]["no_route"]["types"] == {"order.paid": 2}
