"""The worked example in docs/replay.md runs as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "replay.md"


def test_worked_example_rebuilds_the_execution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The workflow example (v1 -> v2 upcaster, projection, snapshots) runs and its assertions hold."""
    text = DOC.read_text()
    section = text[text.index("## Worked example") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    monkeypatch.chdir(tmp_path)
    exec(compile(code.group(1), str(DOC), "exec"), {"__name__": "replay_doc"})
    assert (tmp_path / "workflows.db").exists()
