"""The conformance report: transports x checks -> passed / failed / skipped (reason).

The pytest plugin fills a :class:`ConformanceReport`; it renders as a
terminal table, a markdown table (rows = checks, columns = transports,
cells ``pass`` / ``FAIL`` / ``skip`` with footnoted reasons) and JSON
(``format: outrelay-conformance/1``). Several JSON reports merge into one
table::

    python -m outrelay.conformance.report merge a.json b.json -o report.md [--json all.json]

Every check of the suite is listed, including checks that did not run
(``not run``: deselected, or the run stopped early). Each transport's
declared delivery semantics (``Capabilities.delivery``: ``at_least_once`` or
``at_most_once``) heads its column, next to the verdicts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["FORMAT", "CheckResult", "ConformanceReport", "TransportResults", "main"]

FORMAT = "outrelay-conformance/1"
OUTCOMES = ("passed", "failed", "skipped", "xfailed", "xpassed")
_CELL = {"passed": "pass", "failed": "FAIL", "skipped": "skip", "xfailed": "xfail", "xpassed": "XPASS"}
NOT_RUN = "not run"
DELIVERY_ROW = "(declared delivery)"


@dataclasses.dataclass
class CheckResult:
    """One cell: ``outcome`` is one of :data:`OUTCOMES`; ``reason`` says why it skipped or failed."""

    outcome: str
    reason: str = ""
    duration: float = 0.0


@dataclasses.dataclass
class TransportResults:
    """One column: a transport under test (``key`` is unique, ``label`` is shown)."""

    key: str
    label: str = ""
    transport_class: str = ""
    results: dict[str, CheckResult] = dataclasses.field(default_factory=dict)
    #: the declared ``Capabilities.delivery`` ("" when no check reported it)
    delivery: str = ""

    @property
    def title(self) -> str:
        return self.label or self.key

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(OUTCOMES, 0)
        for r in self.results.values():
            out[r.outcome] = out.get(r.outcome, 0) + 1
        return out


@dataclasses.dataclass
class ConformanceReport:
    """All columns, plus the suite's checks (name -> description) in suite order."""

    checks: dict[str, str] = dataclasses.field(default_factory=dict)
    transports: dict[str, TransportResults] = dataclasses.field(default_factory=dict)

    @classmethod
    def for_suite(cls) -> ConformanceReport:
        """An empty report listing every check of the installed suite."""
        from outrelay.conformance._harness import CHECKS

        return cls(checks={name: c.description for name, c in CHECKS.items()})

    def column(self, key: str) -> TransportResults:
        return self.transports.setdefault(key, TransportResults(key))

    def record(self, key: str, check: str, result: CheckResult) -> None:
        """Set one cell (a later phase of the same test overrides an earlier one)."""
        self.column(key).results[check] = result
        self.checks.setdefault(check, "")

    def rows(self) -> list[str]:
        """Every check of the suite, then any extra test of a suite subclass."""
        extra = [c for t in self.transports.values() for c in t.results if c not in self.checks]
        return list(self.checks) + list(dict.fromkeys(extra))

    @property
    def ok(self) -> bool:
        """No check failed (or unexpectedly passed an xfail)."""
        return not any(r.outcome in ("failed", "xpassed") for t in self.transports.values() for r in t.results.values())

    # -- JSON --------------------------------------------------------------

    def to_json(self) -> dict[str, Any]:
        from outrelay._version import __version__

        return {
            "format": FORMAT,
            "outrelay": __version__,
            "checks": [{"name": n, "description": self.checks.get(n, "")} for n in self.rows()],
            "transports": [
                {
                    "key": t.key,
                    "label": t.label,
                    "class": t.transport_class,
                    "delivery": t.delivery,
                    "counts": t.counts(),
                    "results": {
                        n: dataclasses.asdict(t.results[n]) if n in t.results else {"outcome": NOT_RUN}
                        for n in self.rows()
                    },
                }
                for t in self.transports.values()
            ],
        }

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> ConformanceReport:
        """Inverse of :meth:`to_json`. :raises ValueError: not a conformance report."""
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"not an outrelay conformance report (expected format {FORMAT!r})")
        rep = cls(checks={c["name"]: c.get("description", "") for c in doc.get("checks", [])})
        for t in doc.get("transports", []):
            col = TransportResults(t["key"], t.get("label", ""), t.get("class", ""), delivery=t.get("delivery", ""))
            for name, r in t.get("results", {}).items():
                if r.get("outcome") != NOT_RUN:
                    col.results[name] = CheckResult(r["outcome"], r.get("reason", ""), r.get("duration", 0.0))
            rep.transports[col.key] = col
        return rep

    def write_json(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")

    def merge(self, other: ConformanceReport) -> None:
        """Add ``other``'s columns; a key seen twice gets a ``#2`` suffix."""
        for name, desc in other.checks.items():
            if not self.checks.get(name):
                self.checks[name] = desc
        for key, col in other.transports.items():
            new, n = key, 2
            while new in self.transports:
                new, n = f"{key} #{n}", n + 1
            self.transports[new] = dataclasses.replace(col, key=new)

    # -- tables ------------------------------------------------------------

    def _grid(self) -> tuple[list[str], list[list[str]], list[str]]:
        """Header, body rows and footnotes shared by the text and markdown tables."""
        notes: dict[str, int] = {}
        cols = list(self.transports.values())
        body = []
        if any(t.delivery for t in cols):  # the declared semantics the verdicts below hold the transport to
            body.append([DELIVERY_ROW, *(t.delivery.replace("_", "-") or NOT_RUN for t in cols)])
        for name in self.rows():
            row = [name]
            for t in cols:
                r = t.results.get(name)
                if r is None:
                    row.append(NOT_RUN)
                    continue
                cell = _CELL.get(r.outcome, r.outcome)
                if r.reason and r.outcome != "passed":
                    cell += f" [{notes.setdefault(r.reason, len(notes) + 1)}]"
                row.append(cell)
            body.append(row)
        footnotes = [f"[{n}] {reason}" for reason, n in notes.items()]
        return ["check", *(t.title for t in cols)], body, footnotes

    def to_markdown(self) -> str:
        head, body, notes = self._grid()

        def esc(text: str) -> str:
            return text.replace("|", "\\|").replace("\n", " ")

        lines = ["# outrelay transport conformance", ""]
        lines.append("| " + " | ".join(esc(h) for h in head) + " |")
        lines.append("|" + "---|" * len(head))
        lines += ["| " + " | ".join(esc(c) for c in row) + " |" for row in body]
        totals = ", ".join(
            f"{t.title}: "
            + " ".join(f"{v} {k}" for k, v in t.counts().items() if v)
            + (f" (delivery {t.delivery.replace('_', '-')})" if t.delivery else "")
            for t in self.transports.values()
        )
        lines += ["", f"Totals — {totals}" if totals else "No transport was tested."]
        if notes:
            lines += ["", *(f"{esc(n)}  " for n in notes)]
        return "\n".join(lines) + "\n"

    def write_markdown(self, path: str | Path) -> None:
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(self.to_markdown(), encoding="utf-8")

    def to_text(self, width: int = 120) -> list[str]:
        """The terminal table, one string per line. Columns are headed by the
        label's first word (a legend gives the full labels); long footnotes are
        cut to ``width``."""
        head, body, notes = self._grid()
        short = [h.split(" (", 1)[0][:24] for h in head[1:]]
        legend: list[str] = []
        if len(set(short)) == len(short):
            legend = [f"{s} = {h}" for s, h in zip(short, head[1:], strict=True) if s != h]
            head = [head[0], *short]
        widths = [max(len(r[i]) for r in [head, *body]) for i in range(len(head))]
        out = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in [head, *body]]
        out.insert(1, "  ".join("-" * w for w in widths))
        out += [n if len(n) <= width else n[: width - 3] + "..." for n in [*legend, *notes]]
        return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m outrelay.conformance.report merge A.json B.json -o report.md [--json out.json]``."""
    parser = argparse.ArgumentParser(prog="python -m outrelay.conformance.report")
    sub = parser.add_subparsers(dest="command", required=True)
    merge = sub.add_parser("merge", help="merge JSON reports into one markdown table")
    merge.add_argument("reports", nargs="+", type=Path, help="JSON reports written by --outrelay-report-json")
    merge.add_argument("-o", "--output", type=Path, help="markdown file to write (default: print)")
    merge.add_argument("--json", type=Path, help="also write the merged JSON report here")
    args = parser.parse_args(argv)
    combined = ConformanceReport()
    for path in args.reports:
        try:
            combined.merge(ConformanceReport.from_json(json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: {path}: cannot read conformance report: {exc}", file=sys.stderr)
            return 2
    if args.output:
        combined.write_markdown(args.output)
    else:
        sys.stdout.write(combined.to_markdown())
    if args.json:
        combined.write_json(args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
