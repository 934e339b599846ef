"""No import cycle among the modules of ``outrelay/`` (issue 33).

Every import statement is an edge: module level, inside a function, under
``TYPE_CHECKING``. ``from pkg import name`` is an edge to ``pkg`` (its
``__init__``) as well as to ``pkg.name`` when that is a module; ``import a.b``
is an edge to the deepest module of ``a.b`` that exists. A cycle is a strongly
connected group of two or more modules.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import outrelay

ROOT = Path(outrelay.__file__).parent

#: cycles tolerated, each named by its sorted modules (none: keep it so); a listed cycle that is gone
#: fails the test too, so the list can only shrink
ALLOWED: set[tuple[str, ...]] = set()


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under the package directory ``root``."""
    out = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """The modules of ``mods`` each module imports, by any import statement anywhere in it."""
    out: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        here = mod.split(".") if path.name == "__init__.py" else mod.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    base = ".".join(here[: len(here) - (node.level - 1)] + ([base] if base else []))
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            else:
                continue
            for name in names:
                while name and name not in mods:
                    name = name.rpartition(".")[0]
                if name and name != mod:
                    out[mod].add(name)
    return out


def cycles(graph: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """The strongly connected groups of two or more modules (Tarjan), each as a sorted tuple."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[tuple[str, ...]] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.add(tuple(sorted(group)))

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10_000))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return found


def test_outrelay_has_no_import_cycle() -> None:
    """No import cycle in outrelay/ but those ALLOWED names (none; lazy and TYPE_CHECKING imports count)."""
    mods = modules(ROOT)
    assert len(mods) > 100, f"expected the outrelay package at {ROOT}"
    found = cycles(edges(mods))
    assert not found - ALLOWED, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in sorted(found - ALLOWED))
    assert not ALLOWED - found, f"gone, take it off ALLOWED: {sorted(ALLOWED - found)}"


def _package(tmp_path: Path, files: dict[str, str]) -> dict[str, set[str]]:
    root = tmp_path / "pkg"
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return edges(modules(root))


def test_a_lazy_or_type_checking_import_closes_a_cycle(tmp_path: Path) -> None:
    """An import inside a function or under TYPE_CHECKING counts: the checker reports the cycle it closes."""
    graph = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from pkg.b import B\n",
            "b.py": "def f():\n    from pkg import c\n",
            "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import A\n",
            "d.py": "import pkg.a\n",
        },
    )
    assert cycles(graph) == {("pkg.a", "pkg.b", "pkg.c")}


def test_importing_from_a_package_is_an_edge_to_its_init(tmp_path: Path) -> None:
    """``from pkg import name`` (relative too) is an edge to ``pkg/__init__``, so a submodule importing its
    package's re-exports closes a cycle with the ``__init__`` that imports it."""
    graph = _package(
        tmp_path,
        {
            "__init__.py": "",
            "sub/__init__.py": "from pkg.sub.impl import Thing\n",
            "sub/impl.py": "from . import helpers\n",
            "sub/helpers.py": "X = 1\n",
        },
    )
    assert graph["pkg.sub.impl"] == {"pkg.sub", "pkg.sub.helpers"}
    assert cycles(graph) == {("pkg.sub", "pkg.sub.impl")}
