"""Options of a ``file`` destination."""

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
