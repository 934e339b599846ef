"""The code blocks of README.md and docs/*.md, and how tests/test_docs_examples.py runs them.

Every fenced block is preceded by one marker line:

* ``<!-- docs-test: run NAME [file=PATH] [background[=N]] [until="TEXT"] -->`` — a step of the example
  NAME. The steps of an example run in document order, in one directory. A ``python`` step runs in this
  process, in a namespace the example's python steps share (``background``: as a script, N processes of
  its own, kept running until the example ends, each once its output showed ``until``); with ``file=``
  a block is only written to that file. A ``toml``
  step is written to ``file`` (default ``outrelay.toml``) and checked like a config block. A ``bash``,
  ``sh`` or ``console`` step runs each command line (``$ `` prompts dropped, output lines skipped):
  ``outrelay …`` in this process, anything else with bash; every command must succeed.
* ``<!-- docs-test: config -->`` — a TOML config on its own: parsed, and every destination built.
* ``<!-- docs-test: fragment[ — why] -->`` — not runnable as it stands: a transcript, part of a larger
  program, a file for another tool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

ROOT = Path(__file__).parents[1]
DOCS = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
_FENCE = re.compile(r"^(\s*)```(\S*)\s*$")
_MARK = re.compile(r"^<!-- docs-test: (run|config|fragment)\b(.*?)-->$")
_SHELL = re.compile(r"[|&;<>()$`*?]")


@dataclasses.dataclass(frozen=True)
class Block:
    doc: str
    line: int
    lang: str
    text: str
    kind: str | None  # run | config | fragment; None: no marker
    name: str = ""
    opts: Mapping[str, str] = dataclasses.field(default_factory=dict)

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"


def blocks() -> list[Block]:
    """Every fenced block of the documentation, with its marker."""
    out: list[Block] = []
    for path in DOCS:
        lines = path.read_text().split("\n")
        i = 0
        while i < len(lines):
            m = _FENCE.match(lines[i])
            if m is None:
                i += 1
                continue
            end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
            indent = len(m.group(1))
            text = "\n".join(line[indent:] for line in lines[i + 1 : end]) + "\n"
            prev = next((lines[j].strip() for j in range(i - 1, -1, -1) if lines[j].strip()), "")
            out.append(_block(path.relative_to(ROOT).as_posix(), i + 1, m.group(2), text, prev))
            i = end + 1
    return out


def _block(doc: str, line: int, lang: str, text: str, prev: str) -> Block:
    mark = _MARK.match(prev)
    if mark is None:
        return Block(doc, line, lang, text, None)
    kind, rest = mark.group(1), mark.group(2).strip()
    if kind != "run":
        return Block(doc, line, lang, text, kind)
    words = shlex.split(rest)
    opts = dict(w.split("=", 1) if "=" in w else (w, "") for w in words[1:])
    return Block(doc, line, lang, text, kind, words[0] if words else "", opts)


def commands(block: Block) -> Iterator[str]:
    """The command lines of a shell block: continuations joined, prompts and output lines dropped."""
    pending = ""
    for raw in block.text.splitlines():
        line = raw.rstrip()
        if block.lang == "console":
            if not (line.startswith("$ ") or pending):
                continue
            line = line.removeprefix("$ ")
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        full, pending = (pending + line).strip(), ""
        if full and not full.startswith("#"):
            yield full


@contextlib.contextmanager
def chdir(path: Path) -> Iterator[None]:
    before = Path.cwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def run_command(line: str, cwd: Path, env: Mapping[str, str]) -> tuple[int, str]:
    """Run one command line: ``outrelay …`` without shell syntax in this process, else with bash."""
    words = shlex.split(line, comments=True)
    if words and words[0] == "outrelay" and not _SHELL.search(line.split(" #", 1)[0]):
        return _outrelay(words[1:], cwd, env)
    path = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', os.environ.get('PATH', ''))}"
    proc = subprocess.run(
        ["bash", "-c", line], cwd=cwd, env={**os.environ, **env, "PATH": path}, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    return proc.returncode, proc.stdout + proc.stderr


def _outrelay(args: list[str], cwd: Path, env: Mapping[str, str]) -> tuple[int, str]:
    from outrelay.cli.main import main
    from tests.cli.conftest import _restored_logging

    out = io.TextIOWrapper(io.BytesIO(), encoding="utf-8", write_through=True)
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    code = 0
    try:
        with chdir(cwd), _restored_logging(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            try:
                main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return code, out.buffer.getvalue().decode()  # type: ignore[attr-defined]


class Background:
    """A block run as a script in a process of its own, stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, script: Path, cwd: Path, env: Mapping[str, str], n: int = 0) -> None:
        self.log = cwd / f"{script.stem}-{n}.log"
        self._out = self.log.open("w")
        self.proc = subprocess.Popen(
            [sys.executable, str(script)], cwd=cwd, env={**os.environ, **env}, stdout=self._out,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.log.read_text()
            if text in out:
                return out
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the output of {self.log.name} (exit {self.proc.poll()}):\n{out}")

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self._out.close()
