"""The checkout a benchmark script belongs to, for the relay processes it starts.

``python -m outrelay`` takes the package from the working directory first, so a
benchmark of one checkout run from another checkout's directory would start
that other checkout's relay (an A/B run measuring one relay twice). Start the
relay with ``cwd=ROOT, env=RELAY_ENV``: this checkout's package comes first,
whatever the working directory and ``PYTHONPATH``.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["RELAY_ENV", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]
RELAY_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
