"""Silent traps closed: `tail` without a broker, `config docs` over a user's file, a replay of events that
have no upcaster path (the RabbitMQ check's caveat is tested with the transport)."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.cli.conftest import Cli

FILES = '[outbox]\nurl = "sqlite:///outbox.db"\n[destinations.files]\ntransport = "file"\npath = "out/{stream}.jsonl"\n'


def test_tail_without_a_broker_says_so(cli_here: Cli, tmp_path: Path) -> None:
    """`tail` with no -d, no [bus] and no $OUTRELAY_BUS, or pointed at an in-process destination, exits 2
    saying the in-process bus never sees the relay's events and how to name a broker — instead of printing
    nothing for ever."""
    (tmp_path / "outrelay.toml").write_text(FILES + '[destinations.mem]\ntransport = "memory"\n')
    for args in (("tail",), ("tail", "-d", "mem")):
        proc = cli_here(*args, env={"OUTRELAY_BUS": ""})
        assert proc.returncode == 2 and "tail has no broker to read" in proc.stderr, proc.stderr
        assert "pass -d DESTINATION" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_config_docs_never_overwrites_a_users_file(cli_here: Cli, tmp_path: Path) -> None:
    """`config docs` prints the reference (creating no ./docs/configuration.md), `-o -` prints it (no file
    named "-"), `-o FILE` refuses a file it did not write (exit 2, file intact) unless --force, and writes a
    new or generated one."""
    (tmp_path / "docs").mkdir()
    printed = cli_here("config", "docs")
    assert printed.returncode == 0 and printed.stdout.startswith("# Configuration reference")
    assert not (tmp_path / "docs" / "configuration.md").exists()
    dash = cli_here("config", "docs", "-o", "-")
    assert dash.stdout == printed.stdout and not (tmp_path / "-").exists()
    mine = tmp_path / "docs" / "configuration.md"
    mine.write_text("# My notes\n")
    refused = cli_here("config", "docs", "-o", str(mine))
    assert refused.returncode == 2 and "not overwritten" in refused.stderr and mine.read_text() == "# My notes\n"
    assert cli_here("config", "docs", "-o", str(mine), "--force").returncode == 0
    assert mine.read_text() == printed.stdout


UPCASTERS = """
from outrelay import hookimpl

def _v1_to_v2(data):
    return {**data, "currency": "EUR"}

@hookimpl
def outrelay_add_upcasters(registry):
    registry.register("invoice.issued", "1", _v1_to_v2)
"""


def test_replay_refuses_events_without_an_upcaster_path(
    cli_here: Cli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With upcasters loaded through OUTRELAY_PLUGINS (no entry point), `replay -d D --stream S` of a stream
    holding a version no upcaster leads from is one error line and a non-zero exit with nothing queued, as the
    filtered replay already was; a stream whose events upcast is replayed."""
    from outrelay import Event, Outbox
    from outrelay.core.config import registry
    from outrelay.core.history import upcasting

    (tmp_path / "outrelay.toml").write_text(FILES)
    (tmp_path / "billing_upcasters.py").write_text(UPCASTERS)
    with Outbox.open(f"sqlite:///{tmp_path}/outbox.db") as outbox:
        for stream, version in (("inv-0", "0"), ("inv-1", "1")):
            outbox.append(Event(type="invoice.issued", stream=stream, data={"n": 1}, event_version=version))
    assert cli_here("run", "--drain").returncode == 0
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_default", None)  # the process's plugins, loaded again as the CLI loads them
    monkeypatch.setattr(upcasting, "_default", None)  # this test's registry, loaded as the CLI loads it
    monkeypatch.setenv("OUTRELAY_PLUGINS", "billing_upcasters")
    for args in (("--stream", "inv-0"), ("--stream", "inv-0", "--type", "invoice.*")):
        bad = cli_here("replay", "-d", "files", *args)
        assert bad.returncode == 2 and "no upcaster goes from 0" in bad.stderr, bad.stderr
        assert len(bad.stderr.strip().splitlines()) == 1
    assert upcasting.default_upcasters().current == {"invoice.issued": "2"}
    doc = orjson.loads(cli_here("status", "--json").stdout)
    assert doc["destinations"][0]["pending"] == 0  # nothing queued
    good = cli_here("replay", "-d", "files", "--stream", "inv-1")
    assert good.returncode == 0 and "queued 1 event(s)" in good.stdout, good.stderr
