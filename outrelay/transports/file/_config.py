"""The ``file`` transport: CloudEvents JSON Lines appended to a file.

For the demo and for debugging. Each message is one line, the structured
CloudEvents form; ``fsync = true`` makes "delivered" mean "on disk". The
path may be a template (``"out/{stream}.jsonl"``); parent directories are
created. The reader tails the file.

Open handles are bounded: at most ``max_open_files`` stay open (least
recently used closed first, after a flush — and an fsync with ``fsync``),
and a handle unused for ``idle_close_seconds`` is closed, so a template
that fans out to thousands of files never runs the process out of file
descriptors.
"""

from __future__ import annotations

from pydantic import Field

from outrelay.kit import TransportConfig

__all__ = ["FileConfig"]


class FileConfig(TransportConfig):
    """``[destinations.NAME]`` options of the file transport.

    * ``path`` — the file to append to; may be a template (``"out/{stream}.jsonl"``).
    * ``fsync`` — fsync after each batch: "delivered" means "on disk".
    * ``max_open_files`` — open handles kept (least recently used closed first).
    * ``idle_close_seconds`` — a handle unused this long is closed.
    """

    path: str = "outrelay-events.jsonl"
    fsync: bool = False
    max_open_files: int = Field(32, ge=1, le=10_000, description="open handles kept (least recently used closed first)")
    idle_close_seconds: float = Field(30.0, gt=0, description="a handle unused this long is closed")
