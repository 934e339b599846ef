"""The public API is explicit."""

from __future__ import annotations

import outrelay


def test_all_is_sorted_and_complete() -> None:
    """__all__ is sorted and every name in it exists."""
    assert outrelay.__all__ == sorted(outrelay.__all__)
    for name in outrelay.__all__:
        assert hasattr(outrelay, name), name


def test_public_objects_come_from_outrelay() -> None:
    """Every exported class or function is defined inside the outrelay package."""
    for name in outrelay.__all__:
        obj = getattr(outrelay, name)
        if name in ("hookimpl", "__version__"):  # a pluggy marker instance / a string
            continue
        module = getattr(obj, "__module__", "outrelay")
        assert module.startswith("outrelay"), (name, module)


def test_every_name_the_docs_import_comes_from_a_public_module() -> None:
    """The code blocks of README.md and docs/*.md import outrelay names only from ``outrelay``,
    ``outrelay.kit`` or ``outrelay.conformance``, and every such name exists there."""
    import importlib
    import re

    from tests._docblocks import blocks

    public = ("outrelay", "outrelay.kit", "outrelay.conformance")
    found = 0
    for block in blocks():
        if block.lang != "python":
            continue
        text = re.sub(r"\(\s*([^)]*?)\s*\)", lambda m: m.group(1).replace("\n", " "), block.text)
        for module, names in re.findall(r"^\s*from (outrelay[\w.]*) import ([^\n#]+)", text, re.M):
            assert module in public, f"{block.where}: imports from {module}, not a public module"
            for name in (n.strip().split(" as ")[0] for n in names.split(",") if n.strip()):
                assert hasattr(importlib.import_module(module), name), f"{block.where}: {module}.{name}"
                found += 1
    assert found > 20, f"expected the docs to import outrelay names ({found} found)"
