"""Every first-party transport is built on ``outrelay.kit`` exactly as a third party's would be.

Read statically (every import counts: module level, inside functions, under
``TYPE_CHECKING``): a module under ``outrelay/transports/<package>/`` imports
nothing of outrelay but ``outrelay.kit`` and its own package; no two modules
of a package import each other, directly or round a longer cycle; and no
function in ``outrelay/transports`` or ``outrelay/kit`` is longer than
:data:`MAX_LINES` lines.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import outrelay

ROOT = Path(outrelay.__file__).parent
TRANSPORTS = ROOT / "transports"
PACKAGES = sorted(p.name for p in TRANSPORTS.iterdir() if p.is_dir() and (p / "__init__.py").exists())
MAX_LINES = 60


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement in ``path`` names (relative imports resolved), with its line."""
    here = _module(path).split(".")
    if path.name != "__init__.py":
        here.pop()
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[: len(here) - node.level + 1] + ([base] if base else []))
            out += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
    return out


def _allowed(module: str, package: str) -> bool:
    own = f"outrelay.transports.{package}"
    return not (module == "outrelay" or module.startswith("outrelay.")) or any(
        module == ok or module.startswith(ok + ".") for ok in ("outrelay.kit", own)
    )


def test_transports_are_packages_only() -> None:
    """Each transport is a package of its own: no loose modules beside them but ``__init__.py``."""
    loose = sorted(p.name for p in TRANSPORTS.glob("*.py") if p.name != "__init__.py")
    assert loose == [], f"modules outside a transport package: {loose}"


@pytest.mark.parametrize("package", PACKAGES)
def test_a_transport_imports_only_the_kit(package: str) -> None:
    """No module of the package imports any of outrelay but outrelay.kit and the package itself."""
    bad = [
        f"{path.relative_to(ROOT.parent)}:{line} imports {mod}"
        for path in sorted((TRANSPORTS / package).rglob("*.py"))
        for line, mod in imports(path)
        if not _allowed(mod, package)
    ]
    assert not bad, "\n".join(bad)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in edges:
        if v not in index:
            visit(v)
    return found


def module_graph(package_dir: Path) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (a ``from pkg import name`` counts the package)."""
    files = {_module(p): p for p in package_dir.rglob("*.py")}
    edges: dict[str, set[str]] = {m: set() for m in files}
    for mod, path in files.items():
        for _, name in imports(path):
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != mod:
                edges[mod].add(name)
    return edges


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle_inside_a_transport(package: str) -> None:
    """No two modules of the package import each other, directly or through others."""
    assert _cycles(module_graph(TRANSPORTS / package)) == []


def test_the_cycle_check_sees_a_lazy_cycle(tmp_path: Path) -> None:
    """A cycle closed by a function-level import inside TYPE_CHECKING-free code is found (the check can fail)."""
    pkg = tmp_path / "outrelay" / "transports" / "x"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "_a.py").write_text("from outrelay.transports.x import _b\n")
    (pkg / "_b.py").write_text("def f():\n    from outrelay.transports.x._a import g\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path / "outrelay"
    try:
        assert _cycles(module_graph(pkg)) == [["outrelay.transports.x._a", "outrelay.transports.x._b"]]
    finally:
        ROOT = saved


def _long_functions(folder: Path) -> list[str]:
    out = []
    for path in sorted(folder.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_LINES:
                    out.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} {node.name} ({length} lines)")
    return out


@pytest.mark.parametrize("folder", ["transports", "kit"])
def test_no_long_functions(folder: str) -> None:
    """No function (docstring included) in outrelay/transports or outrelay/kit is over MAX_LINES lines."""
    assert _long_functions(ROOT / folder) == []
