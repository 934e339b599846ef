"""``outrelay new-transport NAME``: a plugin package that lints, type-checks and certifies out of the box.

The generated package is checked the way its author would: ruff and mypy
(strict) in its directory, then its own conformance test, each in a
subprocess; ``outrelay conformance --plugin`` then runs the suite against
it without installing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import outrelay
from tests.cli.conftest import Cli

BIN = Path(sys.executable).parent
SOURCE_ROOT = str(Path(outrelay.__file__).resolve().parent.parent)


def run(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A tool in the generated package's directory, finding it (PYTHONPATH) and outrelay's source (MYPYPATH)."""
    env = {**os.environ, "PYTHONPATH": str(cwd), "MYPYPATH": SOURCE_ROOT}
    env.pop("OUTRELAY_CONFIG", None)
    return subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture
def generated(cli: Cli, tmp_path: Path) -> Path:
    proc = cli("new-transport", "carrier_x", "--directory", "pkg")
    assert proc.returncode == 0, proc.stderr
    assert "wrote 6 files to pkg/" in proc.stdout
    return tmp_path / "pkg"


def test_scaffold_passes_ruff_mypy_and_its_own_conformance_test(generated: Path) -> None:
    """The generated package is ruff-clean, mypy-strict-clean, and its conformance test passes."""
    assert (generated / "pyproject.toml").read_text().count('carrier_x = "outrelay_carrier_x"') == 1
    source = (generated / "outrelay_carrier_x" / "_transport.py").read_text()
    assert "outrelay.core" not in source and "from outrelay.kit import" in source
    ruff = run([str(BIN / "ruff"), "check", "."], generated)
    assert ruff.returncode == 0, ruff.stdout + ruff.stderr
    mypy = run([str(BIN / "mypy")], generated)
    assert mypy.returncode == 0, mypy.stdout + mypy.stderr
    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"], generated)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert " passed" in tests.stdout and "failed" not in tests.stdout


def test_conformance_cli_runs_an_uninstalled_plugin(generated: Path) -> None:
    """`outrelay conformance --plugin module:Class --option ...` certifies a transport with no config file and
    no installation; the transport's declared unreachable options run the broker-down checks."""
    report = generated / "report.json"
    proc = run(
        [
            sys.executable,
            "-m",
            "outrelay",
            "conformance",
            "--plugin",
            "outrelay_carrier_x:CarrierXTransport",
            "--option",
            "max_message_bytes=2048",
            "--timeout",
            "3",
            "--read-timeout",
            "2",
            "--report-json",
            str(report),
        ],
        generated,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    [col] = json.loads(report.read_text())["transports"]
    assert col["label"] == "carrier_x (carrier_x; per-check targets)"
    results = col["results"]
    assert results["start_while_broker_down"]["outcome"] == "passed"
    assert results["payload_over_max_rejected"]["outcome"] == "passed"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["new-transport", "Bad-Name"], "transport name 'Bad-Name' must be a lower-case identifier"),
        (["conformance", "--plugin", "no_such_module_xyz:T"], "--plugin 'no_such_module_xyz:T': cannot import it"),
        (["conformance", "--transport", "memory", "--conformance-config", "nope.toml"], "cannot read the conformance"),
        (["conformance", "--transport", "memory", "--endpoint", "a,b,c"], "--endpoint 'a,b,c' must name"),
    ],
)
def test_bad_input_is_one_line(cli: Cli, args: list[str], message: str) -> None:
    """A bad name or plugin spec exits non-zero with one line saying what and how to fix it, no traceback."""
    proc = cli(*args)
    assert proc.returncode != 0
    assert message in proc.stderr and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_an_existing_directory_is_never_overwritten(cli: Cli, tmp_path: Path) -> None:
    """new-transport refuses a non-empty directory and leaves its files alone."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "keep.txt").write_text("mine")
    proc = cli("new-transport", "carrier", "--directory", "pkg")
    assert proc.returncode != 0 and "already exists and is not empty" in proc.stderr
    assert sorted(p.name for p in (tmp_path / "pkg").iterdir()) == ["keep.txt"]


def test_class_name_follows_the_words_or_the_option(cli: Cli, tmp_path: Path) -> None:
    """Class names capitalise NAME's words, or take --class-name (RedisPubSub, not RedispubsubTransport)."""
    proc = cli("new-transport", "redis_pubsub", "--directory", "a")
    assert proc.returncode == 0 and "classes RedisPubsubTransport" in proc.stdout
    proc = cli("new-transport", "redis_pubsub", "--directory", "b", "--class-name", "RedisPubSub")
    assert proc.returncode == 0, proc.stderr
    source = (tmp_path / "b" / "outrelay_redis_pubsub" / "_transport.py").read_text()
    assert "class RedisPubSubTransport(LifecycleTransport[RedisPubSubConfig]):" in source
    assert "Redispubsub" not in source
    bad = cli("new-transport", "carrier", "--directory", "c", "--class-name", "not-a-class")
    assert bad.returncode != 0 and "--class-name 'not-a-class' must be CapWords" in bad.stderr


def test_a_leaked_socket_fails_one_check_not_every_teardown(generated: Path) -> None:
    """A transport leaking a socket per open() fails sockets_released, and the leak's ResourceWarnings do not
    turn the other checks into teardown errors (the scaffold's filterwarnings)."""
    module = generated / "outrelay_carrier_x" / "_transport.py"
    source = module.read_text()
    opened = "        self._broker = CarrierXBroker.named(self.cfg.broker)\n"
    leak = "        self._leaked = __import__('socket').socket()  # the defect\n"
    module.write_text(source.replace(opened, opened + leak))
    assert leak in module.read_text()
    checks = "sockets_released or open_close or payload_empty or batch_send or close_twice"
    tests = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", checks], generated)
    assert "1 failed, 4 passed" in tests.stdout, tests.stdout[-3000:]
    assert "error" not in tests.stdout.splitlines()[-1], tests.stdout[-3000:]
