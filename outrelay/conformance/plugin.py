"""The pytest plugin (``pytest11`` entry point ``outrelay_conformance``).

It recognises conformance checks — test methods of a
:class:`~outrelay.conformance.ConformanceSuite` subclass — and collects
their outcomes into a :class:`~outrelay.conformance.report.ConformanceReport`:
one column per suite subclass (per parameter, if its fixture is
parametrised), one row per check. At the end of the run it prints the table
and, when asked, writes it:

* ``--outrelay-report-json PATH`` — the JSON report (mergeable with
  ``python -m outrelay.conformance.report merge``);
* ``--outrelay-report-md PATH`` — a markdown table with footnoted reasons.

Each conformance test also carries ``user_properties`` (``outrelay_check``,
``outrelay_transport``, ...), so pytest's own ``--junitxml`` report names
the check and transport of every test case, and the plugin works under
pytest-xdist (outcomes are gathered from the reports, not the items).
The plugin costs nothing in runs without conformance tests: outrelay is
imported only when one is collected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from outrelay.conformance.report import CheckResult, ConformanceReport

__all__ = ["ConformanceCollector", "is_conformance_item"]

_PLUGIN_NAME = "outrelay-conformance-collector"
_PREFIX = "outrelay_"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("outrelay", "outrelay transport conformance")
    group.addoption(
        "--outrelay-report-json", metavar="PATH", default=None, help="write the conformance report as JSON to PATH"
    )
    group.addoption(
        "--outrelay-report-md", metavar="PATH", default=None, help="write the conformance report as a markdown table"
    )


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(ConformanceCollector(config), _PLUGIN_NAME)


def is_conformance_item(item: pytest.Item) -> bool:
    """True for a ``test_*`` method of a ConformanceSuite subclass (checked
    by name so that runs without conformance tests never import outrelay)."""
    cls = getattr(item, "cls", None)
    if cls is None or not getattr(item, "originalname", "").startswith("test_"):
        return False
    return any(c.__name__ == "ConformanceSuite" and c.__module__ == "outrelay.conformance.suite" for c in cls.__mro__)


def _column(item: pytest.Item) -> tuple[str, str]:
    """(unique key, readable name) of the transport column an item belongs to."""
    callspec = getattr(item, "callspec", None)
    suffix = f"[{callspec.id}]" if callspec is not None else ""
    cls = getattr(item, "cls", None)
    parent = item.parent.nodeid if item.parent is not None else ""
    return parent + suffix, (cls.__name__ if cls is not None else parent) + suffix


def _reason(report: pytest.TestReport) -> str:
    """One line saying why a test skipped or failed."""
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        text = str(longrepr[2]).removeprefix("Skipped: ")
    elif getattr(longrepr, "reprcrash", None) is not None:
        text = str(longrepr.reprcrash.message).removeprefix("Failed: ")
    else:
        text = report.longreprtext
    text = " ".join(text.strip().split())
    return text if len(text) <= 300 else text[:297] + "..."


class ConformanceCollector:
    """Gathers conformance outcomes during the run; registered per config."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self._report: ConformanceReport | None = None

    @property
    def report(self) -> ConformanceReport:
        if self._report is None:
            from outrelay.conformance.report import ConformanceReport

            self._report = ConformanceReport.for_suite()
        return self._report

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]) -> None:
        """Tag the item before its report is built, so the report (and junitxml,
        and xdist's controller) knows the check and the transport."""
        if not is_conformance_item(item):
            return
        props = dict(item.user_properties)
        if _PREFIX + "check" not in props:
            key, name = _column(item)
            item.user_properties += [
                (_PREFIX + "check", getattr(item, "originalname", item.name).removeprefix("test_")),
                (_PREFIX + "transport", key),
                (_PREFIX + "transport_name", name),
            ]
        if _PREFIX + "transport_label" not in props:
            target = getattr(item, "funcargs", {}).get("conformance_target")
            label = getattr(target, "label", "")
            if label:
                item.user_properties.append((_PREFIX + "transport_label", str(label)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        props = {k: v for k, v in report.user_properties if isinstance(k, str) and k.startswith(_PREFIX)}
        check = props.get(_PREFIX + "check")
        if check is None:
            return
        result = self._outcome(report)
        col = self.report.column(str(props[_PREFIX + "transport"]))
        col.label = str(props.get(_PREFIX + "transport_label") or col.label or props.get(_PREFIX + "transport_name"))
        col.transport_class = str(props.get(_PREFIX + "transport_class") or col.transport_class)
        col.delivery = str(props.get(_PREFIX + "delivery") or col.delivery)
        if result is not None:
            self.report.record(col.key, str(check), result)

    @staticmethod
    def _outcome(report: pytest.TestReport) -> CheckResult | None:
        from outrelay.conformance.report import CheckResult

        xfail = getattr(report, "wasxfail", None)
        if report.when == "call" or (report.when == "setup" and not report.passed):
            if report.passed:
                return CheckResult("xpassed" if xfail is not None else "passed", str(xfail or ""), report.duration)
            if report.skipped:
                if xfail is not None:
                    return CheckResult("xfailed", str(xfail), report.duration)
                return CheckResult("skipped", _reason(report), report.duration)
            prefix = "error in setup: " if report.when == "setup" else ""
            return CheckResult("failed", prefix + _reason(report), report.duration)
        if report.when == "teardown" and report.failed:
            return CheckResult("failed", "error in teardown: " + _reason(report), report.duration)
        return None

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if hasattr(self.config, "workerinput"):  # an xdist worker: the controller writes
            return
        json_path = self.config.getoption("outrelay_report_json")
        md_path = self.config.getoption("outrelay_report_md")
        if json_path:
            self.report.write_json(json_path)
        if md_path:
            self.report.write_markdown(md_path)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self._report is None or not self._report.transports:
            return
        terminalreporter.write_sep("=", "outrelay conformance")
        width = getattr(getattr(terminalreporter, "_tw", None), "fullwidth", 120)
        for line in self._report.to_text(width):
            terminalreporter.write_line(line)
        for opt in ("outrelay_report_json", "outrelay_report_md"):
            path = self.config.getoption(opt)
            if path:
                terminalreporter.write_line(f"conformance report written to {path}")
