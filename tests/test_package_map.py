"""docs/design.md's package map matches the code: every import between outrelay's top-level
packages is one the map's table allows, and every arrow the map draws exists (issue 33)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import outrelay

ROOT = Path(outrelay.__file__).parent
DESIGN = ROOT.parent / "docs" / "design.md"
LEAVES = {"_version"}  # a leaf every package may import


def allowed_imports(text: str) -> dict[str, set[str]]:
    """package -> the packages it may import, from the table between the package-map markers."""
    table = text.split("<!-- package-map -->", 1)[1].split("<!-- /package-map -->", 1)[0]
    out: dict[str, set[str]] = {}
    for row in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        name = cells[0].strip("`").removeprefix("outrelay").lstrip(".") or "outrelay"
        out[name] = {("outrelay" if c == "outrelay" else c) for c in re.split(r",\s*", cells[2]) if c}
    return out


def package_of(module: str) -> str | None:
    """The top-level package an absolute module name of outrelay belongs to (``outrelay`` for the
    package's own ``__init__``), or None for anything outside outrelay."""
    parts = module.split(".")
    if parts[0] != "outrelay":
        return None
    return "outrelay" if len(parts) == 1 else parts[1]


def actual_imports() -> dict[str, set[str]]:
    """package -> the other packages its modules import (every import statement counts)."""
    out: dict[str, set[str]] = {}
    for path in ROOT.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("").parts
        source = "outrelay" if rel == ("__init__",) else rel[0]
        if source in LEAVES or source == "__main__":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                target = package_of(name)
                if target is not None and target != source and target not in LEAVES:
                    out.setdefault(source, set()).add(target)
    return out


def test_every_import_between_packages_is_on_the_map() -> None:
    allowed = allowed_imports(DESIGN.read_text())
    actual = actual_imports()
    assert set(actual) <= set(allowed), f"packages missing from the map: {sorted(set(actual) - set(allowed))}"
    extra = {f"{p} -> {t}" for p, targets in actual.items() for t in targets - allowed.get(p, set())}
    assert not extra, f"imports the map in docs/design.md does not allow: {sorted(extra)}"


def test_every_arrow_on_the_map_exists() -> None:
    allowed = allowed_imports(DESIGN.read_text())
    actual = actual_imports()
    stale = {f"{p} -> {t}" for p, targets in allowed.items() for t in targets - actual.get(p, set())}
    assert not stale, f"the map in docs/design.md draws imports the code does not have: {sorted(stale)}"


def test_the_map_reader_sees_an_upward_import() -> None:
    """The table parser gives what the rows say (so the tests above can fail)."""
    text = (
        "<!-- package-map -->\n| package | holds | imports |\n| --- | --- | --- |\n"
        "| `outrelay.kit` | x | core |\n| `outrelay.core` | y | |\n<!-- /package-map -->\n"
    )
    assert allowed_imports(text) == {"kit": {"core"}, "core": set()}
    assert package_of("outrelay.transports.kafka") == "transports" and package_of("aiokafka") is None
