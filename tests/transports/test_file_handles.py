"""The file transport keeps a bounded number of files open (LRU + idle close)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from outrelay import Event
from outrelay.core.contract.transport import Delivered, Message
from outrelay.transports.file import FileConfig, FileTransport


def _messages(t: FileTransport, streams: range) -> list[Message]:
    events = [Event(type="t", stream=f"s{i}", data={"i": i}) for i in streams]
    return [Message(e, t.target(e), e.stream, 1) for e in events]


class TestOpenHandles:
    async def test_lru_bounds_open_files_and_loses_no_line(self, tmp_path: Path) -> None:
        """Writing to 50 files with max_open_files=4 never holds more than 4 open, and every line lands."""
        t = FileTransport(FileConfig(path=f"{tmp_path}/{{stream}}.jsonl", max_open_files=4), destination="f")
        await t.open()
        for _ in range(2):
            for lo in range(0, 50, 10):
                results = await t.send(_messages(t, range(lo, lo + 10)))
                assert all(isinstance(r, Delivered) for r in results)
                assert len(t._files) <= 4
        await t.close()
        counts = await asyncio.to_thread(lambda: sorted(len(p.read_text().splitlines()) for p in tmp_path.iterdir()))
        assert counts == [2] * 50

    async def test_idle_handles_are_closed(self, tmp_path: Path) -> None:
        """A handle unused for idle_close_seconds is closed at the next batch."""
        cfg = FileConfig(path=f"{tmp_path}/{{stream}}.jsonl", idle_close_seconds=0.05)
        t = FileTransport(cfg, destination="f")
        await t.open()
        await t.send(_messages(t, range(0, 5)))
        time.sleep(0.1)
        await t.send(_messages(t, range(5, 6)))
        assert list(t._files) == [f"{tmp_path}/s5.jsonl"]
        await t.close()


SCRIPT = """
import asyncio, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (256, 256))
from outrelay import Event, Outbox, Relay, parse_config
out, db = sys.argv[1], sys.argv[2]
outbox = Outbox.open(f"sqlite:///{db}")
outbox.append([Event(type="t", stream=f"s{i}", data={"i": i}) for i in range(1000)])
cfg = parse_config({
    "outbox": {"url": f"sqlite:///{db}"},
    "relay": {"drain_retry_bound": 2},
    "destinations": {"f": {"transport": "file", "path": out + "/{stream}.jsonl", "batch_size": 1000}},
})
summary = asyncio.run(Relay(outbox, cfg).run(drain=True))
print(summary.remaining, summary.counts["f"]["delivered"], summary.counts["f"]["retried"])
"""


def test_thousand_streams_under_ulimit_256(tmp_path: Path) -> None:
    """1,000 streams to 1,000 files drain completely with `ulimit -n 256`, nothing stuck in retry."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SCRIPT), str(out), str(tmp_path / "o.db")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0", "1000", "0"]
    assert len(list(out.iterdir())) == 1000


class TestCut:
    async def test_a_cut_send_keeps_what_it_wrote(self, tmp_path: Path) -> None:
        """A send cancelled while its thread writes records every line it wrote as Delivered and starts
        no further line: the progress and the file agree, so the retry writes nothing twice."""
        from outrelay.kit import Progress, sending

        t = FileTransport(FileConfig(path=f"{tmp_path}/out.jsonl"), destination="f")
        await t.open()
        events = [Event(type="t", stream="s", data={"i": i}) for i in range(20_000)]
        batch = [Message(e, t.target(e), e.stream, 1) for e in events]
        progress = Progress()
        with sending(progress):
            task = asyncio.create_task(t.send(batch))
            out = tmp_path / "out.jsonl"
            for _ in range(400):  # until the thread has written a buffer's worth
                if out.exists() and out.stat().st_size > 0:
                    break
                await asyncio.sleep(0.005)
            task.cancel()
            try:
                await task
                cut = False
            except asyncio.CancelledError:
                cut = True
        await t.close()
        lines = (tmp_path / "out.jsonl").read_text().splitlines()
        delivered = [m for m in batch if isinstance(progress.outcome(m), Delivered)]
        assert cut, "the send finished before it was cancelled: make the batch larger"
        assert 0 < len(delivered) == len(lines) < len(batch)
