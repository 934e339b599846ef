"""`outrelay conformance` certifies a configured webhook destination against a local receiver."""

from __future__ import annotations

from pathlib import Path

from tests.cli.conftest import Cli

CONFIG = """
[destinations.hooks]
transport = "webhook"
url = "https://hooks.example.com/in/{tenant}"    # never contacted: the runner starts its own receiver
secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
"""


def test_conformance_on_a_webhook_destination_passes(cli: Cli, tmp_path: Path) -> None:
    """Every check passes (or skips for a declared capability) against a local receiver verifying the configured
    secret, and the output and report say that the configured url was not contacted."""
    (tmp_path / "outrelay.toml").write_text(CONFIG)
    proc = cli("conformance", "--destination", "hooks", "--report-md", "report.md", timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert (
        first.startswith("conformance: hooks (webhook; a local WebhookReceiver per check") and "not contacted" in first
    )
    assert " failed" not in proc.stdout and " passed" in proc.stdout
    report = (tmp_path / "report.md").read_text()
    assert "| end_to_end_relay | pass |" in report and "| check_unreachable | pass |" in report
    assert "| FAIL" not in report and "| XPASS" not in report
