"""``run_conformance``: the suite against a destination of a config file."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import ClassVar

import pytest

from outrelay.conformance import CHECKS
from outrelay.conformance._harness import run_check
from outrelay.conformance.runner import build_target, target_option
from outrelay.core.envelope import Event
from outrelay.core.errors import ConfigError
from outrelay.transports.file import FileTransport
from outrelay.transports.memory import MemoryTransport


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "outrelay.toml"
    path.write_text(
        f"""
[outbox]
url = "sqlite:///{tmp_path}/outbox.db"

[destinations.mem]
transport = "memory"
target = "orders.{{type}}"
max_message_bytes = 4096

[destinations.files]
transport = "file"
path = "{tmp_path}/out/events.jsonl"
"""
    )
    return path


class ForeignMemory(MemoryTransport):
    """A memory transport that can put a foreign message on its target (the runner's class hook)."""

    async def conformance_publish_foreign(self) -> None:
        MemoryTransport.broker(self.cfg.broker).put_foreign(self.cfg.target, b"not a cloudevent")


def run(config: Path, destination: str, report: Path, **kwargs: object) -> subprocess.CompletedProcess[str]:
    """run_conformance in a child process (it runs pytest.main, which must not nest in this session)."""
    code = (
        "import sys; from outrelay.conformance.runner import run_conformance; "
        f"sys.exit(run_conformance({str(config)!r}, {destination!r}, report_json={str(report)!r}, "
        f"extra_pytest_args=['-q'], **{kwargs!r}))"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=config.parent)


class TestTargetOption:
    def test_common_field_names_are_found(self) -> None:
        """The target option is found among common config field names (memory: target, file: path)."""
        assert target_option(MemoryTransport) == "target"
        assert target_option(FileTransport) == "path"

    def test_transport_may_name_its_target_option(self) -> None:
        """conformance_target_option names the option instead of the guess; None falls back to the guess."""

        class Named(MemoryTransport):
            conformance_target_option: ClassVar[str | None] = "broker"

        class Unnamed(MemoryTransport):
            conformance_target_option: ClassVar[str | None] = None

        assert target_option(Named) == "broker"
        assert target_option(Unnamed) == "target"


class TestBuildTarget:
    def test_per_check_targets_when_a_fresh_target_works(self, config: Path) -> None:
        """When a probe of a fresh target reads back, each check gets its own target."""
        target = build_target(str(config), "mem")
        assert target.isolated
        assert "per-check targets" in target.label
        assert target.make_transport("orconf-x").target(Event(type="t", stream="s")) == "orconf-x"

    def test_configured_target_as_is_when_isolation_is_off(self, config: Path) -> None:
        """With isolate=False every check uses the configured transport and the label says so."""
        target = build_target(str(config), "files", isolate=False)
        assert not target.isolated
        assert "configured target as is" in target.label
        assert target.make_transport("ignored").cfg.path.endswith("out/events.jsonl")  # type: ignore[attr-defined]

    def test_publish_foreign_comes_from_the_transport_class(self, config: Path, tmp_path: Path) -> None:
        """A class's conformance_publish_foreign becomes the target's publish_foreign hook, so the foreign-message
        check runs from the command line too; a class without one gives no hook."""
        target = build_target(None, None, plugins=[f"{__name__}:ForeignMemory"], options={"broker": "orconf-foreign"})
        assert target.publish_foreign is not None
        run_check(target, "subscription_foreign_message", tmp_path)
        assert build_target(str(config), "mem").publish_foreign is None

    def test_member_processes_of_a_plugin_loaded_from_a_file(self, tmp_path: Path) -> None:
        """A transport loaded with --plugin path/to/file.py (a module no name imports) still has group members in
        processes of their own: they import that file too."""
        plugin = tmp_path / "carrier_plugin.py"
        plugin.write_text(
            "from tests.conformance._sqlbus import SqlBusTransport\n\n\n"
            "class CarrierBus(SqlBusTransport):\n    name = 'carrierbus'\n"
        )
        options = {"path": str(tmp_path / "bus.db"), "target": "events"}
        target = build_target(None, None, plugins=[str(plugin)], options=options, read_timeout=2.0, timeout=5.0)
        run_check(target, "subscription_group_processes", tmp_path)

    def test_unknown_destination_is_a_config_error(self, config: Path) -> None:
        """An unknown destination raises ConfigError naming the defined ones."""
        with pytest.raises(ConfigError, match=r"no destination 'nope' \(defined: files, mem\)"):
            build_target(str(config), "nope")


class TestRunConformance:
    def test_memory_destination_conforms(self, config: Path, tmp_path: Path) -> None:
        """The suite against a configured memory destination exits 0 and reports every check."""
        report = tmp_path / "mem.json"
        proc = run(config, "mem", report)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        doc = json.loads(report.read_text())
        [col] = doc["transports"]
        assert col["label"] == "mem (memory; per-check targets)"
        assert list(col["results"]) == list(CHECKS)
        # memory declares conformance_unreachable_options, so even the broker-down checks run; the checks
        # that need a ConformanceTarget hook the runner cannot give skip, naming the hook
        assert {r["outcome"] for r in col["results"].values()} == {"passed", "skipped"}
        skipped = [r["reason"] for r in col["results"].values() if r["outcome"] == "skipped"]
        assert all(reason.startswith("the target declares no ") for reason in skipped), skipped
        assert "outrelay conformance" in proc.stdout

    def test_shared_target_skips_what_needs_its_own(self, config: Path, tmp_path: Path) -> None:
        """On the configured target as is, checks needing a target of their own skip with the reason."""
        report = tmp_path / "files.json"
        proc = run(config, "files", report, isolate=False)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        results = json.loads(report.read_text())["transports"][0]["results"]
        assert results["malformed_target"]["outcome"] == "skipped"
        assert "share one configured target" in results["malformed_target"]["reason"]
        assert results["end_to_end_relay"]["outcome"] == "passed"
