"""The conformance suite against the ``file`` transport (CloudEvents JSON Lines)."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrelay.conformance import ConformanceSuite, ConformanceTarget
from outrelay.conformance._binding import STRUCTURED
from outrelay.transports.file import FileConfig, FileReader, FileTransport


class WholeFile(FileReader):
    """Reads the file from its first line (the durability check's reader attached after the send)."""

    async def start(self) -> None:
        self._pos = 0


class TestFileConformance(ConformanceSuite):
    """Every check: one JSON Lines file per check under tmp_path; "unreachable" is a path below a regular file."""

    @pytest.fixture
    def conformance_target(self, tmp_path: Path) -> ConformanceTarget:
        async def provision(name: str) -> str:
            return str(tmp_path / "out" / f"{name}.jsonl")

        blocker = tmp_path / "not-a-directory"
        blocker.write_bytes(b"")

        def unreachable(target: str) -> FileTransport:
            return FileTransport(FileConfig(path=str(blocker / "x.jsonl")), destination="conformance-down")

        return ConformanceTarget(
            make_transport=lambda target: FileTransport(FileConfig(path=target), destination="conformance"),
            provision=provision,
            make_unreachable=unreachable,
            unsupported={
                "throttle": "a file never throttles",
                "upstream": "a file transport has no network connection to cut",
                "secret": "a file transport takes no credentials",
                "make_forbidden": "a file transport takes no credentials",
                "refuse_target": "a file transport refuses no target per message",
            },
            label="file (JSON Lines in tmp_path)",
            binding=STRUCTURED,
            late_reader=lambda t, path: WholeFile(path),
            read_timeout=2.0,
            timeout=2.0,
        )
