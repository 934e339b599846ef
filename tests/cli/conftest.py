"""Run the real CLI in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

Cli = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def cli(tmp_path: Path) -> Cli:
    """``cli("status", "--json")`` runs ``python -m outrelay`` in tmp_path."""

    def run(
        *args: str, timeout: float = 60, env: dict[str, str] | None = None, input: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        full_env = {**os.environ, "COLUMNS": "200", **(env or {})}
        full_env.pop("OUTRELAY_CONFIG", None)
        return subprocess.run(
            [sys.executable, "-m", "outrelay", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
            input=input,
        )

    return run
