"""``outrelay audit``: verify, export and anchor the tamper-evident audit chain.

``verify`` exits 0 on an intact chain and 1 naming the first bad record;
``export`` writes the records as JSON lines (or, with ``--as-events``,
appends them to the outbox as ``audit.security`` events that routes deliver);
``head`` prints ``SEQ:HASH`` of the newest record, to keep somewhere else and
pass back to ``verify --expect-head`` (which catches a chain cut short).
The HMAC key (``[audit] hmac_key``) is read to check MACs, never printed.
"""

from __future__ import annotations

import contextlib
import sys
import time
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import orjson
import typer

from outrelay.cli._common import ConfigOption, command_group, console, err_console, error_line, load, quiet_stdout
from outrelay.cli._validate import open_existing
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.history import audit
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError, EventError

__all__ = ["app"]

app = command_group("Verify and export the tamper-evident audit chain ([audit] enabled = true).")

#: the event type and stream of exported records (``--as-events``)
EVENT_TYPE = "audit.security"
EVENT_STREAM = "outrelay.audit"
_IDS = uuid.UUID("6f1d3c52-8a0e-4f8e-9a43-2b9f6f0a7d11")  # namespace of exported events' ids


@contextmanager
def _chain(cfg: OutrelayConfig) -> Iterator[audit.AuditStore]:
    with open_existing(cfg) as outbox:
        store = outbox.store
        if not isinstance(store, audit.AuditStore):
            raise ConfigError(f"the outbox store {type(store).__name__} keeps no audit chain")
        yield store


def _head(text: str | None) -> tuple[int, str] | None:
    if text is None:
        return None
    seq, _, digest = text.partition(":")
    if not seq.isdigit() or int(seq) < 1 or len(digest) != 64:
        raise ConfigError(f"--expect-head {text!r} is not SEQ:HASH (as `outrelay audit head` prints it)")
    return int(seq), digest


@app.command("verify")
def verify(
    expect_head: str | None = typer.Option(
        None, "--expect-head", help="SEQ:HASH recorded earlier: fail unless the chain still holds it."
    ),
    no_mac: bool = typer.Option(False, "--no-mac", help="Check hashes only, even with [audit] hmac_key set."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    config: Path | None = ConfigOption,
) -> None:
    """Check every record; exit 1 naming the first edited, deleted, inserted or reordered one."""
    cfg = load(config)
    key = None if no_mac else audit.resolve_key(cfg.audit.hmac_key)
    head = _head(expect_head)
    with _chain(cfg) as store:
        verdict = audit.verify(store, key, expect_head=head)
    if as_json:
        doc = {
            "ok": verdict.ok,
            "checked": verdict.checked,
            "bad_seq": verdict.bad_seq,
            "problem": verdict.problem,
            "macs_checked": verdict.macs_checked,
            "head": f"{verdict.head.seq}:{verdict.head.hash}" if verdict.head else None,
        }
        print(orjson.dumps(doc).decode())
    elif verdict.ok:
        console.print(verdict.line(), markup=False, soft_wrap=True)
    else:
        err_console.print(error_line(verdict.line()), markup=False, soft_wrap=True)
    if not verdict.ok:
        raise typer.Exit(1)


@app.command("head")
def head(config: Path | None = ConfigOption) -> None:
    """Print SEQ:HASH of the newest record (keep it elsewhere; `verify --expect-head` checks it)."""
    cfg = load(config)
    with _chain(cfg) as store:
        last = store.audit_last()
    if last is None:
        err_console.print(error_line("the audit chain is empty"), markup=False)
        raise typer.Exit(1)
    console.print(f"{last.seq}:{last.hash}", markup=False)


@app.command("export")
def export(
    after: int = typer.Option(0, "--after", min=0, help="Only records with seq greater than this."),
    output: Path | None = typer.Option(None, "--output", "-o", help="Write here instead of stdout."),
    as_events: bool = typer.Option(
        False, "--as-events", help=f"Append the records to the outbox as {EVENT_TYPE!r} events instead."
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Write the records as JSON lines, oldest first (or append them as events for the relay)."""
    cfg = load(config)
    if as_events:
        _as_events(cfg, after)
        return
    with _chain(cfg) as store:
        out = output.open("wb") if output is not None else sys.stdout.buffer
        try:
            for line in audit.export_lines(store, after=after):
                out.write(line + b"\n")
        except BrokenPipeError:  # `audit export | head`: the reader has what it wanted
            if output is not None:
                raise ConfigError(f"cannot write {output}: broken pipe") from None
            quiet_stdout()
            return
        except OSError as exc:
            raise ConfigError(f"cannot write {output or 'stdout'}: {exc.strerror}") from None
        finally:
            if output is not None:
                out.close()
            else:
                with contextlib.suppress(BrokenPipeError):
                    out.flush()


def _as_events(cfg: OutrelayConfig, after: int) -> None:
    """Append each record as an event whose id derives from the record's hash, so exporting
    again skips what an earlier export appended."""
    added = skipped = 0
    with open_existing(cfg) as outbox:
        store = outbox.store
        if not isinstance(store, audit.AuditStore):
            raise ConfigError(f"the outbox store {type(store).__name__} keeps no audit chain")
        while rows := store.audit_page(after, 500):
            events = [
                Event(
                    type=EVENT_TYPE,
                    stream=EVENT_STREAM,
                    source=cfg.source or "outrelay/audit",
                    id=str(uuid.uuid5(_IDS, r.hash)),
                    data=r.as_dict(),
                )
                for r in rows
            ]
            try:
                outbox.append(events)
                added += len(events)
            except EventError:  # some were exported before: one at a time
                for e in events:
                    try:
                        outbox.append(e)
                        added += 1
                    except EventError:
                        skipped += 1
            after = rows[-1].seq
    note = f"; {skipped} already exported" if skipped else ""
    console.print(f"appended {added} {EVENT_TYPE} event(s){note}; routes deliver them", markup=False)


def record(cfg: OutrelayConfig, kind: str, details: Mapping[str, object], store: object | None = None) -> None:
    """Record an operator action in the audit chain when ``[audit] enabled`` (opening the
    outbox unless ``store`` is given); nothing otherwise.

    :raises ConfigError: the key cannot be read, or the store keeps no chain.
    """
    if not cfg.audit.enabled:
        return
    if store is not None:
        audit.record_action(store, cfg, kind, dict(details), time.time())
        return
    with open_existing(cfg) as outbox:
        audit.record_action(outbox.store, cfg, kind, dict(details), time.time())
