"""The conformance report model: JSON round trip, merging, markdown and terminal tables."""

from __future__ import annotations

import json
from pathlib import Path

from outrelay.conformance import CHECKS
from outrelay.conformance.report import CheckResult, ConformanceReport, main


def sample(key: str, label: str, failing: str | None = None) -> ConformanceReport:
    rep = ConformanceReport.for_suite()
    for name in list(CHECKS)[:3]:
        rep.record(key, name, CheckResult("passed", duration=0.1))
    rep.record(key, "dedupe_same_id", CheckResult("skipped", "transport declares no native_dedupe"))
    if failing:
        rep.record(key, failing, CheckResult("failed", "metadata: sent {'a': 'b'} | received {}"))
    rep.column(key).label = label
    return rep


class TestConformanceReport:
    def test_json_round_trip(self) -> None:
        """A report survives to_json/from_json with its checks, labels, outcomes and reasons."""
        rep = sample("k", "kafka (tansu)", failing="metadata_roundtrip")
        again = ConformanceReport.from_json(json.loads(json.dumps(rep.to_json())))
        assert again.to_json() == rep.to_json()
        assert again.transports["k"].results["dedupe_same_id"].reason == "transport declares no native_dedupe"

    def test_every_check_is_listed_even_if_not_run(self) -> None:
        """Checks that did not run appear as 'not run' in JSON and tables."""
        doc = sample("k", "x").to_json()
        assert [c["name"] for c in doc["checks"]] == list(CHECKS)
        assert doc["transports"][0]["results"]["end_to_end_relay"] == {"outcome": "not run"}
        assert any(line.startswith("end_to_end_relay") and "not run" in line for line in sample("k", "x").to_text())

    def test_markdown_footnotes_share_numbers_and_escape_pipes(self) -> None:
        """Identical reasons share one footnote number, and '|' in a reason does not break the table."""
        rep = sample("a", "A", failing="metadata_roundtrip")
        rep.merge(sample("b", "B"))
        text = rep.to_markdown()
        assert "| check | A | B |" in text
        assert "| metadata_roundtrip | FAIL [1] | not run |" in text
        assert "| dedupe_same_id | skip [2] | skip [2] |" in text
        assert "[1] metadata: sent {'a': 'b'} \\| received {}" in text
        assert not rep.ok

    def test_merge_keeps_both_columns_with_the_same_key(self) -> None:
        """Merging two reports whose columns share a key keeps both, the second suffixed."""
        rep = sample("k", "one")
        rep.merge(sample("k", "two"))
        assert [t.label for t in rep.transports.values()] == ["one", "two"]
        assert list(rep.transports) == ["k", "k #2"]


class TestMergeCommand:
    def test_merge_writes_one_markdown_table(self, tmp_path: Path) -> None:
        """`python -m outrelay.conformance.report merge a.json b.json -o report.md` writes one combined table."""
        a, b, md, out = tmp_path / "a.json", tmp_path / "b.json", tmp_path / "r.md", tmp_path / "all.json"
        sample("x", "nats").write_json(a)
        sample("y", "redis", failing="per_key_order").write_json(b)
        assert main(["merge", str(a), str(b), "-o", str(md), "--json", str(out)]) == 0
        text = md.read_text()
        assert "| check | nats | redis |" in text
        assert "| per_key_order | not run | FAIL [1] |" in text
        assert len(json.loads(out.read_text())["transports"]) == 2

    def test_merge_rejects_a_file_that_is_not_a_report(self, tmp_path: Path, capsys: object) -> None:
        """A JSON file that is not a conformance report makes merge exit 2 naming the file."""
        bad = tmp_path / "bad.json"
        bad.write_text('{"hello": 1}')
        assert main(["merge", str(bad)]) == 2

    def test_declared_delivery_heads_each_column(self) -> None:
        """The declared delivery semantics show next to the verdicts: a first row and the totals line."""
        rep = sample("a", "A")
        rep.column("a").delivery = "at_least_once"
        rep.merge(sample("b", "B"))
        rep.column("b").delivery = "at_most_once"
        text = rep.to_markdown()
        assert "| (declared delivery) | at-least-once | at-most-once |" in text
        assert "(delivery at-most-once)" in text
        again = ConformanceReport.from_json(json.loads(json.dumps(rep.to_json())))
        assert again.transports["b"].delivery == "at_most_once"
