"""``outrelay demo``: the newcomer's first command, no broker needed.

Creates a SQLite outbox and a config in a directory, starts a local
signed-webhook receiver, appends workflow events over several streams,
relays them with a progress bar, then verifies on the receiving side that
every signature is valid, every event arrived, and each stream's order held.
"""

from __future__ import annotations

import asyncio
import base64
import os
import secrets
import shlex
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from outrelay.cli._common import console, err_console
from outrelay.core.config.config import parse_config
from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.config.registry import get_registry
from outrelay.core.model.envelope import Event
from outrelay.core.relay.relay import Relay
from outrelay.core.stores.outbox import Outbox

__all__ = ["demo"]

_LIFECYCLE = (
    "workflow.created",
    "workflow.started",
    "activity.scheduled",
    "activity.started",
    "activity.completed",
    "activity.scheduled",
    "activity.started",
    "activity.failed",
    "retry.scheduled",
    "activity.retried",
    "activity.completed",
    "workflow.completed",
)


class _ProgressPlugin:
    def __init__(self, progress: Progress, task: Any) -> None:
        self.progress = progress
        self.task = task

    @hookimpl
    def outrelay_batch_settled(self, destination: str, messages: Any, results: Any, elapsed: float) -> None:
        from outrelay.core.contract.transport import Delivered

        if destination == "hooks":
            self.progress.advance(self.task, sum(isinstance(r, Delivered) for r in results))


def _config_text(db: Path, url: str, secret: str, audit: Path) -> str:
    return f"""# written by `outrelay demo`
[outbox]
url = "sqlite:///{db}"

[destinations.hooks]
transport = "webhook"
url = "{url}"
secret = "${{OUTRELAY_DEMO_SECRET:-{secret}}}"
allow_private_network = true   # the demo receiver listens on 127.0.0.1
[destinations.hooks.retry]
initial_delay = 0.1
max_delay = 2.0

[destinations.audit]
transport = "file"
path = "{audit}"

[[routes]]
types = ["*"]
destinations = ["hooks", "audit"]
"""


def demo(
    directory: Path | None = typer.Option(None, "--dir", help="Where to create the outbox (default: a temp dir)."),
    events: int = typer.Option(360, "--events", "-n", min=1, max=1_000_000, help="How many events to relay."),
    streams: int = typer.Option(12, "--streams", min=1, max=10_000, help="Spread over this many streams."),
) -> None:
    """Relay a few hundred signed workflow events to a local webhook receiver and verify them."""
    base = Path(directory) if directory else Path(tempfile.mkdtemp(prefix="outrelay-demo-"))
    base.mkdir(parents=True, exist_ok=True)
    ok = asyncio.run(_demo(base.resolve(), events, streams))
    if not ok:
        raise typer.Exit(1)


async def _demo(base: Path, n_events: int, n_streams: int) -> bool:
    from outrelay.transports.webhook.receiver import WebhookReceiver

    secret = "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()
    db, audit, cfg_path = base / "outbox.db", base / "audit.jsonl", base / "outrelay.toml"
    for p in (db, audit):
        if p.exists():
            p.unlink()
    async with WebhookReceiver(secrets=secret) as receiver:
        cfg_path.write_text(_config_text(db, receiver.url, secret, audit), encoding="utf-8")
        import tomllib

        os.environ.setdefault("OUTRELAY_DEMO_SECRET", secret)
        cfg = parse_config(tomllib.loads(cfg_path.read_text()), where=str(cfg_path))
        console.print(f"[bold]outrelay demo[/] in {base}")
        console.print(f"  receiver  {receiver.url} (Standard Webhooks signatures, HMAC-SHA256)")
        outbox = Outbox.open(cfg.outbox.url)
        t0 = time.perf_counter()
        batch = []
        for i in range(n_events):
            stream = f"wf-{i % n_streams:04d}"
            step = i // n_streams
            batch.append(
                Event(
                    type=_LIFECYCLE[step % len(_LIFECYCLE)],
                    stream=stream,
                    data={"workflow": stream, "step": step},
                    tenant="acme" if i % 2 else "globex",
                    source="urn:outrelay:demo",
                    correlation_id=stream,
                )
            )
        outbox.append(batch)
        console.print(f"  appended  {n_events} events over {n_streams} streams in {time.perf_counter() - t0:.2f}s")
        relay = Relay(outbox, cfg, registry=get_registry().copy())  # the progress plugin goes on the copy
        with Progress(
            TextColumn("  relaying "), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=console
        ) as progress:
            task = progress.add_task("relay", total=n_events)
            relay.registry.pm.register(_ProgressPlugin(progress, task))
            t1 = time.perf_counter()
            summary = await relay.run(drain=True)
            elapsed = time.perf_counter() - t1
        outbox.close()
        return _verify(receiver, summary, n_events, elapsed, base, cfg_path, audit)


def _verify(
    receiver: Any, summary: Any, n_events: int, elapsed: float, base: Path, cfg_path: Path, audit: Path
) -> bool:
    requests = list(receiver.requests)
    bad_sig = [r for r in requests if not r.verified]
    seen: dict[str, list[int]] = defaultdict(list)
    for ev in receiver.events():
        seen[ev.stream].append(ev.json()["step"])
    first: dict[str, list[int]] = {}
    for s, steps in seen.items():
        uniq: list[int] = []
        for step in steps:
            if step not in uniq:
                uniq.append(step)
        first[s] = uniq
    unique = sum(len(v) for v in first.values())
    in_order = all(v == sorted(v) for v in first.values())
    audit_lines = 0
    if audit.exists():
        with audit.open("rb") as f:
            audit_lines = sum(1 for _ in f)
    rate = n_events / elapsed if elapsed > 0 else float("inf")
    console.print(
        f"  delivered {unique}/{n_events} unique events to the webhook in {elapsed:.2f}s ({rate:,.0f} events/s)"
    )
    console.print(f"  verified  {len(requests) - len(bad_sig)}/{len(requests)} signatures")
    console.print(f"  order     {'kept in every stream' if in_order else 'VIOLATED'} ({len(first)} streams)")
    console.print(f"  audit     {audit_lines} CloudEvents lines in {audit}")
    ok = not bad_sig and unique == n_events and in_order and summary.remaining == 0 and audit_lines >= n_events
    if ok:
        console.print("[green]✓ every event arrived, signed and in order.[/]")
        prog = _prog()
        console.print(f"  next: {prog} status -c {shlex.quote(str(cfg_path))}", markup=False)
        console.print(f"        the events as CloudEvents (the file destination): {audit}", markup=False)
        console.print(
            f"        the receiver has stopped (events emitted now would wait for it): "
            f"{prog} demo --dir {shlex.quote(str(base))} runs it all again",
            markup=False,
        )
    else:
        err_console.print("outrelay: demo verification failed (see the lines above)", markup=False)
    return ok


def _prog() -> str:
    """How this process was started, to repeat it in hints: a venv's ``outrelay`` by its path (the
    venv may not be activated), ``python -m outrelay`` with this interpreter."""
    argv0 = sys.argv[0] if sys.argv else ""
    if Path(argv0).name == "outrelay":
        return shlex.quote(argv0)
    if argv0.endswith("__main__.py"):
        return f"{shlex.quote(sys.executable)} -m outrelay"
    return "outrelay"
