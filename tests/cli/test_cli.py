"""The command line, run as a real subprocess."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from tests.cli.conftest import Cli

CONFIG = """
[outbox]
url = "sqlite:///outbox.db"

[destinations.files]
transport = "file"
path = "out/{stream}.jsonl"

[destinations.picky]
transport = "memory"
reject_types = ["bad.event"]
[destinations.picky.retry]
initial_delay = 0.01
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "outrelay.toml").write_text(CONFIG)
    return tmp_path


def assert_one_line_error(proc: object, needle: str, code: int = 2) -> None:
    err = proc.stderr  # type: ignore[attr-defined]
    assert proc.returncode == code, (proc.returncode, err)  # type: ignore[attr-defined]
    assert "Traceback" not in err and needle in err
    assert len(err.strip().splitlines()) == 1, err


class TestErrors:
    def test_bad_config_file(self, cli: Cli, tmp_path: Path) -> None:
        """A TOML syntax error is one line with file and position, exit 2, no traceback."""
        (tmp_path / "outrelay.toml").write_text("[outbox\n")
        assert_one_line_error(cli("run"), "outrelay.toml: invalid TOML")

    def test_unknown_transport(self, cli: Cli, tmp_path: Path) -> None:
        """An unknown transport is one line naming the installed ones, exit 2, no traceback."""
        (tmp_path / "outrelay.toml").write_text('[destinations.x]\ntransport = "carrier-pigeon"\n')
        assert_one_line_error(cli("run", "--drain"), "unknown transport 'carrier-pigeon'")

    def test_unknown_option(self, cli: Cli, tmp_path: Path) -> None:
        """A misspelt transport option names file, destination and option; `check` refuses it as `run` does
        (exit 2, one line), before it creates the outbox."""
        (tmp_path / "outrelay.toml").write_text('[destinations.x]\ntransport = "file"\npth = "a"\n')
        assert_one_line_error(cli("run"), "outrelay.toml: destinations.x: pth: unknown option")
        assert_one_line_error(cli("check"), "outrelay.toml: destinations.x: pth: unknown option")
        assert not (tmp_path / "outbox.db").exists()

    def test_missing_config(self, cli: Cli) -> None:
        """Without a config file the error says how to give one."""
        assert_one_line_error(cli("status"), "config file not found")

    def test_unset_secret_variable(self, cli: Cli, tmp_path: Path) -> None:
        """An unset ${VAR} names the variable and the key, without a traceback."""
        (tmp_path / "outrelay.toml").write_text(
            '[destinations.h]\ntransport = "file"\npath = "${OUTRELAY_TEST_NOPE}"\n'
        )
        assert_one_line_error(cli("status"), "OUTRELAY_TEST_NOPE")

    def test_bad_emit_data(self, cli: Cli, project: Path) -> None:
        """Invalid --data JSON is a one-line error."""
        assert_one_line_error(
            cli("emit", "--type", "t", "--stream", "s", "--data", "{nope"), "--data is not valid JSON"
        )

    def test_bad_event_type(self, cli: Cli, project: Path) -> None:
        """An invalid event type is a one-line usage error (exit 2, like bad --data) and nothing is appended."""
        assert_one_line_error(cli("emit", "--type", "bad type", "--stream", "s"), "event type")


class TestWorkflow:
    def test_emit_run_status(self, cli: Cli, project: Path) -> None:
        """Emitted events are relayed by `run --drain` and counted by `status --json`."""
        assert (
            cli("emit", "--type", "workflow.created", "--stream", "wf-1", "--data", '{"a": 1}', "-n", "25").returncode
            == 0
        )
        st = orjson.loads(cli("status", "--json").stdout)
        assert st["unrouted"] == 25
        proc = cli("run", "--drain")
        assert proc.returncode == 0, proc.stderr
        assert "delivered 50" in proc.stdout
        lines = (project / "out" / "wf-1.jsonl").read_text().splitlines()
        assert [orjson.loads(line)["data"]["n"] for line in lines] == list(range(1, 26))
        st = orjson.loads(cli("status", "--json").stdout)
        by_dest = {d["destination"]: d for d in st["destinations"]}
        assert by_dest["files"]["delivered"] == 25 and by_dest["files"]["pending"] == 0

    def test_dlq_list_show_replay_purge(self, cli: Cli, project: Path) -> None:
        """A rejected event shows in `dlq list/show`; replay queues it again; purge removes it."""
        cli("emit", "--type", "bad.event", "--stream", "s1", "--data", '{"x": 1}')
        cli("emit", "--type", "good.event", "--stream", "s1")
        proc = cli("run", "--drain")
        assert proc.returncode == 1 and "1 dead-lettered" in proc.stderr
        (dl,) = orjson.loads(cli("dlq", "list", "--json").stdout)
        assert dl["destination"] == "picky" and dl["type"] == "bad.event" and dl["attempts"] == 1
        shown = orjson.loads(cli("dlq", "show", str(dl["id"])).stdout)
        assert shown["event"]["data"] == {"x": 1} and "rejected" in shown["reason"]
        assert "queued 1" in cli("dlq", "replay", str(dl["id"])).stdout
        assert orjson.loads(cli("dlq", "list", "--json").stdout) == []
        cli("run", "--drain")  # rejected again
        (dl2,) = orjson.loads(cli("dlq", "list", "--json").stdout)
        assert "purged 1" in cli("dlq", "purge", "--all", "--yes").stdout
        assert orjson.loads(cli("dlq", "list", "--json").stdout) == []
        assert dl2["id"] != dl["id"]

    def test_dlq_unknown_id(self, cli: Cli, project: Path) -> None:
        """Showing a dead letter that does not exist is a one-line error."""
        assert cli("migrate").returncode == 0
        assert_one_line_error(cli("dlq", "show", "999"), "no dead letter with id 999", code=1)

    def test_disable_enable(self, cli: Cli, project: Path) -> None:
        """A disabled destination keeps its events pending and status says so; enable resumes it."""
        cli("disable", "files", "--reason", "maintenance")
        cli("emit", "--type", "t", "--stream", "s")
        assert cli("run", "--drain").returncode == 1
        st = orjson.loads(cli("status", "--json").stdout)
        files = next(d for d in st["destinations"] if d["destination"] == "files")
        assert files["disabled"] == "maintenance" and files["pending"] == 1
        cli("enable", "files")
        assert cli("run", "--drain").returncode == 0

    def test_check_and_transports(self, cli: Cli, project: Path) -> None:
        """`check` prints one line per destination; `transports` lists every first-party transport."""
        proc = cli("check")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert [line.split()[0] for line in proc.stdout.strip().splitlines()] == ["ok", "ok", "ok"]
        names = {t["name"] for t in orjson.loads(cli("transports", "--json").stdout)}
        assert {
            "memory",
            "file",
            "webhook",
            "kafka",
            "nats",
            "rabbitmq",
            "redis",
            "sns",
            "sqs",
            "pubsub",
            "servicebus",
            "pulsar",
        } <= names
