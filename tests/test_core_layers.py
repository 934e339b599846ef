"""``outrelay.core`` is layered: each sub-package's docstring says which other sub-packages it may
import ("May import from outrelay.core: ..."), the code keeps to it (every import statement counts,
function-level and ``TYPE_CHECKING`` ones included), the declared arrows form no cycle, and the
core map in docs/design.md says the same as the docstrings (issue 33)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import outrelay

CORE = Path(outrelay.__file__).parent / "core"
DESIGN = CORE.parent.parent / "docs" / "design.md"
MAY = re.compile(r"^May import from outrelay\.core: (.+)\.$", re.M)


def sub_packages() -> list[str]:
    """The sub-packages of outrelay.core (directories with an ``__init__.py``)."""
    return sorted(p.parent.name for p in CORE.glob("*/__init__.py"))


def declared(name: str, root: Path = CORE) -> set[str]:
    """What a sub-package's docstring says it may import from outrelay.core."""
    doc = ast.get_docstring(ast.parse((root / name / "__init__.py").read_text())) or ""
    found = MAY.search(doc)
    assert found, f"outrelay/core/{name}/__init__.py: the docstring has no 'May import from outrelay.core: ...' line"
    text = found.group(1)
    return set() if text == "nothing of outrelay.core" else set(re.split(r",\s*", text))


def actual(name: str, root: Path = CORE) -> set[str]:
    """The other sub-packages of outrelay.core that a sub-package's modules import."""
    out: set[str] = set()
    for path in (root / name).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            modules: list[str] = []
            if isinstance(node, ast.Import):
                modules = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                modules = [node.module]
            for module in modules:
                parts = module.split(".")
                if parts[:2] == ["outrelay", "core"] and len(parts) > 2 and parts[2] != name:
                    out.add(parts[2])
    return out


def cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of the graph as a path (first node repeated at the end), or [] if it has none."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, set())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node] = 2
        path.pop()
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def design_map(text: str) -> dict[str, set[str]]:
    """sub-package -> what it imports, from the table between the core-map markers."""
    table = text.split("<!-- core-map -->", 1)[1].split("<!-- /core-map -->", 1)[0]
    out: dict[str, set[str]] = {}
    for row in table.strip().splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        out[cells[0].strip("`")] = {c for c in re.split(r",\s*", cells[2]) if c}
    return out


def test_core_is_only_sub_packages() -> None:
    """Every module of outrelay.core lives in a sub-package (the package's own __init__ aside)."""
    loose = sorted(p.name for p in CORE.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"modules directly in outrelay/core (put each in a sub-package): {loose}"
    assert len(sub_packages()) >= 6


def test_every_import_is_declared() -> None:
    undeclared = {f"{n} -> {t}" for n in sub_packages() for t in actual(n) - declared(n)}
    assert not undeclared, f"imports a sub-package's docstring does not allow: {sorted(undeclared)}"


def test_every_declared_arrow_exists() -> None:
    stale = {f"{n} -> {t}" for n in sub_packages() for t in declared(n) - actual(n)}
    assert not stale, f"docstrings declare imports the code does not have: {sorted(stale)}"


def test_the_layers_have_no_cycle() -> None:
    graph = {n: declared(n) for n in sub_packages()}
    assert cycle(graph) == [], f"the declared layers form a cycle: {' -> '.join(cycle(graph))}"


def test_the_design_doc_shows_the_same_layers() -> None:
    shown = design_map(DESIGN.read_text())
    assert shown == {n: declared(n) for n in sub_packages()}, "docs/design.md's core map differs from the docstrings"


def test_the_checks_can_fail(tmp_path: Path) -> None:
    """An undeclared import (inside a function) and a cycle are both seen."""
    for name, may, code in (("a", "b", "def f():\n    from outrelay.core.b.x import y\n"), ("b", "a", "")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text(f'"""Doc.\n\nMay import from outrelay.core: {may}.\n"""\n')
        (tmp_path / name / "m.py").write_text(code)
    assert actual("a", tmp_path) == {"b"} and actual("b", tmp_path) == set()
    assert declared("b", tmp_path) == {"a"}
    assert cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert cycle({"a": {"b"}, "b": set()}) == []
