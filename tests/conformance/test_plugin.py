"""The conformance pytest plugin, exercised with ``pytester`` on good and deliberately broken transports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from outrelay.conformance import CHECKS

# ``pytest_plugins`` in a non-root conftest is an error in pytest 8+, so pytester is required here.
pytest_plugins = ["pytester"]

MODULE = """
import dataclasses
import uuid

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.core.model.errors import RetryableError
from outrelay.transports.memory import MemoryConfig, MemoryTransport


class DropsMetadata(MemoryTransport):
    async def send(self, batch):
        return await super().send([dataclasses.replace(m, event=m.event.replace(metadata={})) for m in batch])


class Reorders(MemoryTransport):
    async def send(self, batch):
        return list(reversed(await super().send(list(reversed(batch)))))


class LeaksVendorErrors(MemoryTransport):
    async def open(self):
        if self.cfg.broker.startswith("down"):
            raise ConnectionRefusedError(111, "Connection refused")
        await super().open()

    async def check(self):
        raise RetryableError("cannot reach 127.0.0.1:1: start the broker")


class AlwaysDown(MemoryTransport):
    async def open(self):
        raise RetryableError("cannot reach 127.0.0.1:1")


class Hangs(MemoryTransport):
    async def open(self):
        if self.cfg.broker.startswith("down"):
            await __import__("asyncio").sleep(3600)
        await super().open()


def unreachable(cls):
    def make(target):
        name = f"down-{uuid.uuid4().hex[:8]}"
        cls.broker(name).down = True
        return cls(MemoryConfig(broker=name, target=target))
    return make


class TestConformance(ConformanceSuite):
    @pytest.fixture
    def conformance_target(self):
        cls = CLASS
        broker = f"b-{uuid.uuid4().hex[:8]}"
        return ConformanceTarget(
            make_transport=lambda t: cls(MemoryConfig(broker=broker, target=t, max_message_bytes=MAX)),
            make_unreachable=unreachable(cls),
            late_reader=lambda t, target: t.reader(target, from_beginning=True),
            label=LABEL,
            read_timeout=1.0,
            timeout=0.5,
        )
"""


def run_suite(
    pytester: pytest.Pytester, cls: str, *args: str, max_bytes: int | None = 4096
) -> tuple[Any, dict[str, Any]]:
    """Run the suite on memory transport subclass ``cls``; return the run and its JSON report."""
    pytester.makepyfile(
        test_suite=MODULE.replace("CLASS", cls).replace("MAX", repr(max_bytes)).replace("LABEL", repr(f"{cls} label"))
    )
    report = pytester.path / "report.json"
    result = pytester.runpytest("-p", "no:asyncio", "--outrelay-report-json", str(report), *args)
    return result, json.loads(report.read_text())


#: the checks that need a ConformanceTarget hook the memory target of MODULE does not give (or member
#: processes, which the memory transport declares it cannot have)
_HOOK_PREFIXES = ("fault_", "connect_", "binding_", "refused_", "throttle_", "secret_", "forbidden_")
HOOKED = {n for n in CHECKS if n.startswith(_HOOK_PREFIXES)}
HOOKED |= {"subscription_group_processes", "subscription_member_killed", "subscription_foreign_message"}
#: the in-process memory transport's send() never waits, so there is nothing to cancel midway
NEVER_WAITS = {"cancel_mid_batch"}


def outcomes(doc: dict[str, Any]) -> dict[str, str]:
    [transport] = doc["transports"]
    return {name: r["outcome"] for name, r in transport["results"].items()}


class TestConformingTransport:
    def test_every_check_passes_or_skips(self, pytester: pytest.Pytester) -> None:
        """A conforming transport passes every check it gives the hooks for (the others skip, naming the
        missing hook); the JSON report lists every check of the suite."""
        result, doc = run_suite(pytester, "MemoryTransport")
        skips = HOOKED | NEVER_WAITS
        result.assert_outcomes(passed=len(CHECKS) - len(skips), skipped=len(skips))
        assert [c["name"] for c in doc["checks"]] == list(CHECKS)
        assert {n for n, o in outcomes(doc).items() if o == "passed"} == set(CHECKS) - skips
        reasons = {r.get("reason", "") for n, r in doc["transports"][0]["results"].items() if n in HOOKED}
        assert all(r.startswith("the target declares no ") for r in reasons), reasons
        assert doc["transports"][0]["label"] == "MemoryTransport label"
        assert doc["transports"][0]["class"] == "MemoryTransport"
        assert doc["transports"][0]["delivery"] == "at_least_once"

    def test_undeclared_capabilities_skip_with_reasons(self, pytester: pytest.Pytester) -> None:
        """Without max_message_bytes the size checks skip with the reason, in the JSON, terminal and markdown tables."""
        md = pytester.path / "report.md"
        result, doc = run_suite(pytester, "MemoryTransport", "--outrelay-report-md", str(md), max_bytes=None)
        results = doc["transports"][0]["results"]
        skipped = {n for n, r in results.items() if r["outcome"] == "skipped"} - HOOKED - NEVER_WAITS
        assert skipped == {
            "payload_max_size",
            "payload_over_max_rejected",
            "batch_partial_failure",
            "ordered_batch_halts_key",
        }
        assert {results[n]["reason"] for n in skipped} == {"transport declares no max_message_bytes"}
        result.stdout.fnmatch_lines(
            [
                "*outrelay conformance*",
                "payload_max_size*skip [[]1[]]*",
                "[[]1[]] transport declares no max_message_bytes",
            ]
        )
        text = md.read_text()
        assert "| check | MemoryTransport label |" in text
        assert all(f"| {name} |" in text for name in CHECKS)
        assert "| payload_max_size | skip [1] |" in text
        assert "[1] transport declares no max_message_bytes" in text


class TestBrokenTransports:
    def test_dropped_metadata_fails_the_fidelity_checks(self, pytester: pytest.Pytester) -> None:
        """A transport that drops metadata fails exactly the checks that carry metadata."""
        _, doc = run_suite(pytester, "DropsMetadata")
        failed = {n for n, o in outcomes(doc).items() if o == "failed"}
        assert failed == {
            "metadata_roundtrip",
            "unicode_attributes",
            "cloudevents_envelope",
            "cloudevents_binding",
            "hostile_attributes",
            "subscription_fanout",  # its subscribers are handed an event whose metadata is gone
            "batch_left_unchanged",
        }
        reason = doc["transports"][0]["results"]["metadata_roundtrip"]["reason"]
        assert "metadata: sent" in reason

    def test_reordering_fails_the_order_checks(self, pytester: pytest.Pytester) -> None:
        """A transport that reverses each batch fails per-key order, ordered-batch halting, the relay run and the
        subscription checks that look at stream order."""
        _, doc = run_suite(pytester, "Reorders")
        failed = {n for n, o in outcomes(doc).items() if o == "failed"}
        subscriptions = {"subscription_group_tasks", "subscription_stop_hands_over", "subscription_fanout",
                         "subscription_from_beginning"}  # fmt: skip
        assert failed == {"per_key_order", "ordered_batch_halts_key", "end_to_end_relay", *subscriptions}
        assert "out of order" in doc["transports"][0]["results"]["per_key_order"]["reason"]

    def test_vendor_exception_is_named(self, pytester: pytest.Pytester) -> None:
        """A builtin/vendor exception escaping open() fails the broker-down check, naming the exception;
        pytest's JUnit XML carries the check and transport of each test case."""
        junit = pytester.path / "junit.xml"
        _, doc = run_suite(
            pytester, "LeaksVendorErrors", "-k", "broker_down or check_unreachable", "--junitxml", str(junit)
        )
        results = doc["transports"][0]["results"]
        assert results["start_while_broker_down"]["outcome"] == "failed"
        assert "builtins.ConnectionRefusedError" in results["start_while_broker_down"]["reason"]
        assert results["check_unreachable"]["outcome"] == "passed"
        assert results["payload_empty"] == {"outcome": "not run"}
        xml = junit.read_text()
        assert '<property name="outrelay_check" value="start_while_broker_down"' in xml
        assert '<property name="outrelay_transport_label" value="LeaksVendorErrors label"' in xml

    def test_unexpected_outrelay_error_names_the_call(self, pytester: pytest.Pytester) -> None:
        """An OutrelayError a check did not expect fails it with a one-line reason naming the call that raised."""
        _, doc = run_suite(pytester, "AlwaysDown", "-k", "payload_empty or close_twice")
        results = doc["transports"][0]["results"]
        assert results["payload_empty"]["reason"] == (
            "raised by open(): unexpected RetryableError: cannot reach 127.0.0.1:1"
        )
        assert results["close_twice"]["reason"].startswith("raised by open(): unexpected RetryableError")

    def test_hang_fails_fast(self, pytester: pytest.Pytester) -> None:
        """An open() that never returns fails the check within the bound instead of hanging the run."""
        result, doc = run_suite(pytester, "Hangs", "-k", "start_while_broker_down")
        reason = doc["transports"][0]["results"]["start_while_broker_down"]["reason"]
        assert "did not return within 0.5s" in reason
        assert result.duration < 10


def test_report_lists_extra_tests_of_a_subclass(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """A suite subclass's own test methods appear in the report after the suite's checks."""
    pytester.makepyfile(
        test_extra=MODULE.replace("CLASS", "MemoryTransport").replace("MAX", "None").replace("LABEL", "'m'")
        + "\n    def test_my_own(self):\n        assert True\n"
    )
    report = tmp_path / "r.json"
    pytester.runpytest("-p", "no:asyncio", "-k", "my_own or payload_empty", "--outrelay-report-json", str(report))
    doc = json.loads(report.read_text())
    assert [c["name"] for c in doc["checks"]][-1] == "my_own"
    assert outcomes(doc)["my_own"] == "passed"
