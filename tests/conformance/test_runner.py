"""``run_conformance``: the suite against a destination of a config file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import pytest

from outrelay.conformance import CHECKS
from outrelay.conformance._harness import run_check
from outrelay.conformance._runner_hooks import RunnerHooks, endpoint_fields, load_hooks
from outrelay.conformance.runner import build_target, target_option
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError
from outrelay.transports.file import FileTransport
from outrelay.transports.memory import MemoryTransport
from tests.peers.redis import redis_url

__all__ = ["redis_url"]  # the fixture


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

    def test_unsupported_declared_on_the_transport_class(self, config: Path) -> None:
        """A class's conformance_unsupported reaches the target (so a check such as durable_late_reader skips
        with the class's reason from the command line too); a config file's unsupported adds to it and wins."""
        declared = dict(MemoryTransport.conformance_unsupported)
        assert build_target(str(config), "mem").unsupported == declared
        hooks = RunnerHooks(unsupported={"throttle": "no throttling", "processes": "the file's reason"})
        got = build_target(str(config), "mem", hooks=hooks).unsupported
        assert got == {**declared, "throttle": "no throttling", "processes": "the file's reason"}

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
        # ... and memory's send() never waits, so a cancellation cannot land mid-send
        never_waits = "every send() finished before it could be cancelled"
        assert all(r.startswith(("the target declares no ", never_waits)) for r in skipped), skipped
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


class TestConformanceConfig:
    def test_unknown_key_and_bad_value_are_one_line_errors(self, tmp_path: Path) -> None:
        """A misspelt key or a bad value names the file and what is wrong, with the known keys."""
        path = tmp_path / "conf.toml"
        path.write_text('[conformance]\nsecert = "x"\n')
        with pytest.raises(ConfigError, match=r"unknown key\(s\) secert; known: .*secret") as info:
            load_hooks(path)
        assert str(path) in str(info.value)
        path.write_text('[conformance]\nbinding = "carrier-pigeon"\n')
        with pytest.raises(ConfigError, match="known are amqp, http, kafka, mqtt, nats, structured"):
            load_hooks(path)
        path.write_text('[conformance]\nendpoint = ["a", "b", "c"]\n')
        with pytest.raises(ConfigError, match="name the URL option"):
            load_hooks(path)

    def test_every_hook_of_the_file_becomes_a_target_field(self, tmp_path: Path) -> None:
        """forbidden, refused target, secret option, binding, late reader and declared limitations reach the
        ConformanceTarget the runner builds."""
        path = tmp_path / "conf.toml"
        path.write_text(
            "[conformance]\n"
            'label = "mem by file"\ntimeout = 3\nforbidden = { down = true }\nrefused_target = "nowhere"\n'
            'secret_option = "broker"\nbinding = { name = "memory", prefix = "ce-" }\n'
            'late_reader = { from_beginning = true }\nunsupported = { throttle = "never throttles" }\n'
        )
        target = build_target(
            None, None, transport="memory", options={"broker": "s3cr3t-broker"}, hooks=load_hooks(path)
        )
        assert (target.label, target.timeout, target.secret) == ("mem by file", 3.0, "s3cr3t-broker")
        assert target.binding is not None and target.binding.prefix == "ce-"
        assert target.unsupported == {**MemoryTransport.conformance_unsupported, "throttle": "never throttles"}
        assert target.make_forbidden is not None and target.make_forbidden("t").cfg.down  # type: ignore[attr-defined]
        assert target.refuse_target is not None and target.late_reader is not None

    def test_code_hooks_give_any_field_and_unknown_ones_are_named(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """hooks = "module:function" adds code-only hooks (throttle here); a field ConformanceTarget lacks is a
        one-line ConfigError naming it."""
        (tmp_path / "orconf_code_hooks.py").write_text(
            "async def throttle(target):\n    return 2.0\n\n"
            "def good(build):\n    return {'throttle': throttle}\n\n"
            "def bad(build):\n    return {'throtle': throttle}\n"
        )
        monkeypatch.syspath_prepend(str(tmp_path))
        path = tmp_path / "conf.toml"
        path.write_text('[conformance]\nhooks = "orconf_code_hooks:good"\n')
        target = build_target(None, None, transport="memory", hooks=load_hooks(path))
        assert target.throttle is not None
        path.write_text('[conformance]\nhooks = "orconf_code_hooks:bad"\n')
        with pytest.raises(ConfigError, match=r"unknown ConformanceTarget field\(s\) throtle"):
            build_target(None, None, transport="memory", hooks=load_hooks(path))

    def test_url_endpoint_is_rewritten_to_the_proxy(self) -> None:
        """A URL option (credentials, path kept), a list of URLs and host:port strings point at the proxy."""
        made: list[dict[str, object]] = []

        def per_check(target: str, overrides: dict[str, object]) -> Any:
            made.append(overrides)

        fields = endpoint_fields(("url",), {"url": "redis://u:pw@10.1.2.3:6380/2?x=1"}, {}, per_check)
        assert fields["upstream"]("t") == ("10.1.2.3", 6380)
        fields["make_transport_via"]("t", "127.0.0.1", 9999)
        assert made[-1] == {"url": "redis://u:pw@127.0.0.1:9999/2?x=1"}
        fields = endpoint_fields(("servers",), {"servers": ["nats://a:4222", "nats://b"]}, {}, per_check)
        assert fields["upstream"]("t") == ("a", 4222)
        fields["make_transport_via"]("t", "127.0.0.1", 1)
        assert made[-1] == {"servers": ["nats://127.0.0.1:1", "nats://127.0.0.1:1"]}
        fields = endpoint_fields(("bootstrap",), {"bootstrap": "k1:9092"}, {}, per_check)
        assert fields["upstream"]("t") == ("k1", 9092)
        with pytest.raises(ConfigError, match="names no host and port"):
            endpoint_fields(("url",), {"url": "carrier://somewhere"}, {}, per_check)

    def test_fault_checks_and_file_hooks_run_for_a_url_configured_transport(
        self, tmp_path: Path, redis_url: str
    ) -> None:
        """`outrelay conformance --endpoint url` with a config file: the fault checks proxy a Redis transport
        configured by URL, and the file's binding, late reader, forbidden credentials and code hooks apply."""
        url = redis_url
        hooks = tmp_path / "conf_hooks.py"
        hooks.write_text(
            "import redis.asyncio as r\n\n"
            "def hooks(build):\n"
            "    async def cleanup(key):\n"
            f"        c = r.Redis.from_url({url!r})\n"
            "        await c.delete(key)\n"
            "        await c.aclose()\n"
            "    return {'cleanup': cleanup}\n"
        )
        conf = tmp_path / "conf.toml"
        conf.write_text(
            '[conformance]\nendpoint = "url"\nbinding = { name = "redis", prefix = "ce_" }\n'
            'late_reader = { from_beginning = true }\nhooks = "conf_hooks:hooks"\n'
            'forbidden = { username = "orconf-nobody", password = "wrong-password" }\n'
        )
        checks = "fault_cut_idle connect_black_hole binding_rules durable_late_reader forbidden_send_permanent"
        code = (
            "import sys; from outrelay.conformance.runner import run_conformance; "
            f"sys.exit(run_conformance(None, None, transport='redis', options={{'url': {url!r}}}, "
            f"conformance_config={str(conf)!r}, report_json={str(tmp_path / 'r.json')!r}, timeout=5, read_timeout=5, "
            f"extra_pytest_args=['-q', '-k', {' or '.join(checks.split())!r}]))"
        )
        env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
        results = json.loads((tmp_path / "r.json").read_text())["transports"][0]["results"]
        assert {n: results[n]["outcome"] for n in checks.split()} == dict.fromkeys(checks.split(), "passed")
