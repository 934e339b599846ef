"""The repository stands alone: license, changelog, tox envs matching CI, docs whose links resolve."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).parents[1]


def test_license_is_the_apache_2_text() -> None:
    """LICENSE holds the full Apache License 2.0 text that pyproject's license field names."""
    text = (ROOT / "LICENSE").read_text()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text and len(text.splitlines()) > 150
    assert 'license = "Apache-2.0"' in (ROOT / "pyproject.toml").read_text()


def test_changelog_has_an_unreleased_section() -> None:
    """CHANGELOG.md starts with an Unreleased section."""
    text = (ROOT / "CHANGELOG.md").read_text()
    assert text.startswith("# Changelog") and "## [Unreleased]" in text


def test_tox_envs_run_the_ci_commands() -> None:
    """tox.ini has lint, type, test and conformance envs running the commands of .ci/run."""
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    ci = (ROOT / ".ci" / "run").read_text()
    envs = tox["tox"]["env_list"].replace(",", " ").split()
    assert {"lint", "type", "py311", "conformance"} <= set(envs)
    assert "ruff check outrelay tests benchmarks" in tox["testenv:lint"]["commands"]
    assert "ruff check outrelay tests benchmarks" in ci
    assert tox["testenv:type"]["commands"].strip() == "mypy" and ".venv/bin/mypy\n" in ci
    assert "python -m pytest" in tox["testenv"]["commands"]
    assert "--outrelay-report-md" in tox["testenv:conformance"]["commands"]
    assert "--outrelay-report-md" in ci


def test_relative_links_in_readme_and_docs_resolve() -> None:
    """Every relative Markdown link of README.md and docs/*.md names a file of the repository."""
    broken = []
    for md in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", md.read_text()):
            if "://" in target or target.startswith("mailto:"):
                continue
            if not (md.parent / target).exists():
                broken.append(f"{md.relative_to(ROOT)} -> {target}")
    assert not broken, broken
