"""Validation before side effects: the whole config is checked alike by `check --offline`, `check` and `run`
(exit 2, nothing created), operator commands never create an outbox, and outbox errors that waiting does not
cure fail a start at once."""

from __future__ import annotations

import time
from pathlib import Path

from tests.cli.conftest import Cli


def one_line(proc: object, needle: str, code: int = 2) -> str:
    """The one stderr line of a failed command, checked for ``needle``, ``code`` and no traceback."""
    err: str = proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode == code, (proc.returncode, err, proc.stdout)  # type: ignore[attr-defined]
    assert "Traceback" not in err and needle in err, err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_config_that_is_not_utf8_is_one_line(cli_here: Cli, tmp_path: Path) -> None:
    """A Latin-1 config file is one line naming the file, the byte and its line (exit 2), not a traceback."""
    (tmp_path / "latin1.toml").write_bytes(b'[outbox]\nurl = "sqlite:///caf\xe9.db"\n')
    err = one_line(cli_here("status", "-c", "latin1.toml"), "latin1.toml: not UTF-8 text")
    assert "0xe9 on line 2" in err and "save the file as UTF-8" in err


def test_a_port_out_of_range_is_a_config_error_everywhere(cli_here: Cli, tmp_path: Path) -> None:
    """A URL's port of 70000 fails `check --offline`, `check` and `run --drain` alike with exit 2 at once,
    naming destination, option and port; nothing is created."""
    (tmp_path / "outrelay.toml").write_text(
        '[destinations.hooks]\ntransport = "webhook"\nurl = "http://127.0.0.1:70000/h"\n'
        '[destinations.bus]\ntransport = "nats"\nservers = ["nats://127.0.0.1:4222", "nats://n2:99999"]\n'
    )
    for args in (("check", "--offline"), ("check",), ("run", "--drain")):
        started = time.monotonic()
        err = one_line(cli_here(*args), "destinations.hooks: url: port 70000 of '127.0.0.1:70000' is out of range")
        assert "destinations.bus: servers[1]: port 99999" in err and time.monotonic() - started < 5
    assert not (tmp_path / "outbox.db").exists()
    (tmp_path / "outrelay.toml").write_text(
        '[outbox]\nurl = "postgresql://db:54321x/app"\n[destinations.f]\ntransport = "file"\npath = "o.jsonl"\n'
    )
    one_line(cli_here("check", "--offline"), "outbox.url: port '54321x' of 'db:54321x' is not a number")


def test_check_refuses_destination_errors_as_run_does(cli_here: Cli, tmp_path: Path) -> None:
    """An unknown transport, an unknown option and a bad URL inside destinations make `check` (online or not)
    exit 2 with one line listing all three, as `run` does, before the SQLite outbox is created; `status`
    shows such a destination as an invalid config instead of "ok"."""
    good = '[destinations.files]\ntransport = "file"\npath = "out.jsonl"\n'
    bad = (
        '[destinations.x]\ntransport = "webhok"\n'
        '[destinations.y]\ntransport = "webhook"\nurl = "http://127.0.0.1:9/h"\nsteam = 1\n'
        '[destinations.z]\ntransport = "webhook"\nurl = "notaurl"\n'
    )
    (tmp_path / "outrelay.toml").write_text(good + bad)
    for args in (("check", "--offline"), ("check",), ("run",)):
        err = one_line(cli_here(*args), "destinations.x: unknown transport 'webhok'")
        assert "destinations.y: steam: unknown option" in err and "destinations.z: url:" in err
    assert not (tmp_path / "outbox.db").exists()
    (tmp_path / "outrelay.toml").write_text(good)
    assert cli_here("migrate").returncode == 0
    (tmp_path / "outrelay.toml").write_text(good + bad)
    status = cli_here("status")
    assert status.returncode == 0, status.stderr
    assert "x (webhok) invalid config: unknown transport 'webhok'" in status.stdout
    assert "z (webhook) invalid config: url:" in status.stdout and "files (file) ok" in status.stdout


def test_operator_commands_never_create_an_outbox(cli_here: Cli, tmp_path: Path) -> None:
    """`status`, `dlq list` (also --consumer), `audit verify`, `retry` and `replay` on a mistyped outbox path
    say there is no outbox there (exit 2) and create nothing; a SQLite file without outbox tables is named too."""
    (tmp_path / "outrelay.toml").write_text(
        '[outbox]\nurl = "sqlite:///typo.db"\n[destinations.x]\ntransport = "file"\npath = "o.jsonl"\n'
    )
    for args in (
        ("status",),
        ("dlq", "list"),
        ("dlq", "list", "--consumer", "all"),
        ("audit", "verify"),
        ("retry", "-d", "x"),
        ("replay", "-d", "x"),
    ):
        one_line(cli_here(*args), "no outbox at 'typo.db'" if "--consumer" not in args else "no consumer dead-letter")
        assert not (tmp_path / "typo.db").exists(), args
    import sqlite3

    sqlite3.connect(tmp_path / "typo.db").execute("CREATE TABLE t (x)").connection.close()
    one_line(cli_here("status"), "'typo.db' is a SQLite database without an outbox (no outrelay tables)")


def test_permanent_outbox_errors_fail_a_start_at_once(cli_here: Cli, tmp_path: Path) -> None:
    """A SQLite outbox that is not a database, or whose directory is a file, fails `run` and `check` at once
    with one line (exit 1), instead of being retried as an outage with a warning per attempt."""
    (tmp_path / "garbage.db").write_bytes(b"this is not sqlite" * 10)
    (tmp_path / "afile").write_text("")
    for url, needle in (
        ("sqlite:///garbage.db", "'garbage.db' is not a SQLite database"),
        ("sqlite:///afile/outbox.db", "cannot create the outbox 'afile/outbox.db': 'afile' is not a directory"),
    ):
        (tmp_path / "outrelay.toml").write_text(
            f'[outbox]\nurl = "{url}"\n[destinations.x]\ntransport = "file"\npath = "o.jsonl"\n'
        )
        started = time.monotonic()
        one_line(cli_here("run", "--drain"), needle, code=1)
        assert time.monotonic() - started < 3
        check = cli_here("check")
        assert check.returncode == 1 and f"FAIL  outbox       {needle}" in check.stdout, check.stdout


def test_check_reads_the_keys_run_would_read(cli_here: Cli, tmp_path: Path) -> None:
    """A [crypto] key whose variable is unset fails `check --offline` as it fails `run`: exit 2, one line
    naming the key, nothing created; with the key set, `emit` seals what it appends (at_rest)."""
    import base64
    import os

    from outrelay import Outbox

    (tmp_path / "outrelay.toml").write_text(
        '[crypto]\nencrypt_with = "k1"\nat_rest = true\n[crypto.keys]\nk1 = "env:OR_TEST_DOC_K1"\n'
        '[destinations.f]\ntransport = "file"\npath = "o.jsonl"\n'
    )
    for args in (("check", "--offline"), ("run", "--drain")):
        one_line(cli_here(*args, env={"OR_TEST_DOC_K1": ""}), "crypto.keys.k1")
    assert not (tmp_path / "outbox.db").exists()
    key = base64.b64encode(os.urandom(32)).decode()
    assert cli_here("emit", "-t", "t", "-s", "s", "-d", '{"secret": 1}', env={"OR_TEST_DOC_K1": key}).returncode == 0
    with Outbox.open(f"sqlite:///{tmp_path}/outbox.db") as outbox:
        (event,) = outbox.store.events()
    assert event.metadata["keyid"] == "k1" and b"secret" not in event.data
