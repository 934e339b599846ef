"""The shape of ``outrelay/transports`` (transport contract v2): every first-party transport is a
package built on ``outrelay.kit`` exactly as a third-party plugin would be.

* a transport package imports nothing of outrelay but ``outrelay.kit`` and its own modules
  (lazy imports inside functions and ``TYPE_CHECKING`` imports count);
* no import cycle inside a package (same rule: every import statement is an edge);
* every transport is a package (``outrelay/transports/NAME/``), not a loose module;
* no function in ``outrelay/transports``, ``outrelay/kit`` or ``outrelay/core`` is over 60 lines.

:data:`KNOWN` lists what is still being migrated; an entry that no longer fails fails the
test, so the list can only shrink.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import outrelay

ROOT = Path(outrelay.__file__).parent
TRANSPORTS = ROOT / "transports"
MAX_LINES = 60

#: violations still being worked off (see the module docstring); empty when the migration is done
KNOWN: set[str] = set()


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    """``(line, module)`` for every import statement in ``path``, lazy ones included; a relative
    import is resolved against the file's package."""
    package = ".".join(("outrelay", *path.relative_to(ROOT).parent.parts))
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            yield node.lineno, base
            yield from ((node.lineno, f"{base}.{a.name}") for a in node.names)


def _as_module(name: str) -> str:
    """``name`` if it is a module or package of outrelay, else the module it is a member of."""
    rel = Path(*name.split(".")[1:])
    if (ROOT / rel).is_dir() or (ROOT / rel).with_suffix(".py").exists():
        return name
    return name.rsplit(".", 1)[0]


def _package_of(path: Path) -> str:
    rel = path.relative_to(TRANSPORTS)
    return "outrelay.transports." + rel.parts[0] if len(rel.parts) > 1 else "outrelay.transports"


def _module_of(path: Path) -> str:
    return ".".join(("outrelay", *path.relative_to(ROOT).with_suffix("").parts)).removesuffix(".__init__")


def _files() -> list[Path]:
    files = sorted(TRANSPORTS.rglob("*.py"))
    assert len(files) > 20, f"expected the transport packages under {TRANSPORTS}"
    return files


def import_violations() -> set[str]:
    """Imports of outrelay modules other than ``outrelay.kit`` and the importing package's own."""
    bad: set[str] = set()
    for path in _files():
        own = _package_of(path)
        for _, mod in _imports(path):
            if not (mod == "outrelay" or mod.startswith("outrelay.")):
                continue
            if mod == "outrelay.kit" or mod.startswith("outrelay.kit."):
                continue
            if own != "outrelay.transports" and (mod == own or mod.startswith(own + ".")):
                continue
            if own == "outrelay.transports" and mod.startswith("outrelay.transports."):
                continue  # the registration module names the packages
            bad.add(f"import {_module_of(path)} -> {_as_module(mod)}")
    return bad


def cycle_violations() -> set[str]:
    """One entry per transport package whose modules import each other in a cycle."""
    bad: set[str] = set()
    for pkg_dir in sorted(p for p in TRANSPORTS.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        modules = {_module_of(p): p for p in pkg_dir.rglob("*.py")}
        graph = {
            m: {t for _, imp in _imports(p) for t in (imp, imp.rsplit(".", 1)[0]) if t in modules and t != m}
            for m, p in modules.items()
            if not m.endswith(pkg_dir.name)  # the package's __init__ re-exports; it is not part of a cycle
        }
        graph = {m: {t for t in ts if t in graph} for m, ts in graph.items()}
        cycle = _find_cycle(graph)
        if cycle:
            bad.add(f"cycle {pkg_dir.name}: " + " -> ".join(c.rsplit(".", 1)[1] for c in cycle))
    return bad


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def module_violations() -> set[str]:
    """Loose modules directly under ``outrelay/transports`` (every transport is a package)."""
    return {f"module {p.name}" for p in TRANSPORTS.glob("*.py") if p.name != "__init__.py"}


def length_violations() -> set[str]:
    """Functions over :data:`MAX_LINES` lines (decorators and docstring included)."""
    bad: set[str] = set()
    for path in [*_files(), *sorted((ROOT / "kit").rglob("*.py")), *sorted((ROOT / "core").rglob("*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
                if (node.end_lineno or start) - start + 1 > MAX_LINES:
                    bad.add(f"long {_module_of(path)}.{node.name}")
    return bad


def _check(found: set[str], kind: str) -> None:
    known = {k for k in KNOWN if k.startswith(kind)}
    new = sorted(found - known)
    fixed = sorted(known - found)
    assert not new, "transport layout broken:\n" + "\n".join(new)
    assert not fixed, "no longer failing, remove from KNOWN:\n" + "\n".join(fixed)


def test_transports_import_only_the_kit() -> None:
    _check(import_violations(), "import ")


def test_no_import_cycle_inside_a_transport_package() -> None:
    _check(cycle_violations(), "cycle ")


def test_every_transport_is_a_package() -> None:
    _check(module_violations(), "module ")


def test_no_function_over_60_lines() -> None:
    _check(length_violations(), "long ")


def test_the_checks_see_lazy_imports_and_cycles(tmp_path: Path) -> None:
    """The checks can fail: a lazy core import and a two-module cycle are both found."""
    src = tmp_path / "m.py"
    src.write_text("def f():\n    from outrelay.core.model.envelope import Event\n")
    assert "outrelay.core.model.envelope" in {m for _, m in _imports_of(src)}
    assert _find_cycle({"a": {"b"}, "b": {"a"}}) == ["a", "b", "a"]
    assert _find_cycle({"a": {"b"}, "b": set()}) is None


def _imports_of(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
