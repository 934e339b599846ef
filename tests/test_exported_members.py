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
