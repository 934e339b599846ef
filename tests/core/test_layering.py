"""``outrelay.core`` is the innermost layer: it never imports transports, plugins, conformance or the CLI."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import outrelay

CORE = Path(outrelay.__file__).parent / "core"
UPPER = ("outrelay.transports", "outrelay.plugins", "outrelay.conformance", "outrelay.cli")


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an ``import``/``from ... import`` in ``path`` names, lazy ones inside functions included."""
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def _upward(module: str) -> bool:
    return any(module == up or module.startswith(up + ".") for up in UPPER)


def test_core_source_never_imports_an_outer_layer() -> None:
    """No module under outrelay/core has an import statement (even a lazy one) naming an outer layer."""
    files = sorted(CORE.rglob("*.py"))
    assert len(files) > 10, f"expected the core package at {CORE}"
    bad = [
        f"{path.relative_to(CORE.parent.parent)}:{line} imports {mod}"
        for path in files
        for line, mod in _imports(path)
        if _upward(mod)
    ]
    assert not bad, "core imports an outer layer:\n" + "\n".join(bad)


def test_the_checker_sees_a_lazy_upward_import(tmp_path: Path) -> None:
    """The static check catches an upward import hidden inside a function (so the test above can fail)."""
    src = tmp_path / "m.py"
    src.write_text(
        "def f():\n    from outrelay.transports.memory import MemoryTransport\n    import outrelay.cli.main\n"
    )
    assert [m for _, m in _imports(src) if _upward(m)] == [
        "outrelay.transports.memory",
        "outrelay.transports.memory.MemoryTransport",
        "outrelay.cli.main",
    ]


def test_importing_every_core_module_loads_no_outer_layer() -> None:
    """Importing outrelay and every core module in a fresh interpreter leaves outer layers out of sys.modules."""
    mods = sorted(
        "outrelay." + ".".join(p.relative_to(CORE.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in CORE.rglob("*.py")
    )
    code = (
        "import importlib, sys\n"
        f"for m in {mods!r}:\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ImportError:\n"  # a store whose optional driver is absent: not a layering question
        "        pass\n"
        f"print('\\n'.join(sorted(m for m in sys.modules if m.startswith({UPPER!r}))))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "", f"importing core loaded: {proc.stdout.split()}"
