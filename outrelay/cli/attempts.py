"""``outrelay attempts`` (the delivery-attempt log) and ``outrelay retry --event ID`` (its ``--event`` half;
the command itself is in :mod:`.status`)."""

from __future__ import annotations

import re
import time
from datetime import UTC, datetime
from pathlib import Path

import orjson
import typer

from outrelay.cli._common import ConfigOption, console, err_console, error_line, load, mask, secrets_of
from outrelay.cli._validate import open_existing
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.model.errors import ConfigError, NotFoundError
from outrelay.core.relay import attempts as log

__all__ = ["register", "retry_event"]

_RELATIVE = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _since(text: str | None, now: float) -> float | None:
    """``--since``: an ISO 8601 time (UTC unless it says otherwise) or an age such as 90s, 15m, 2h, 7d.

    :raises ConfigError: neither (exit 2)."""
    if text is None:
        return None
    m = _RELATIVE.match(text.strip())
    if m:
        return now - float(m.group(1)) * _UNIT[m.group(2)]
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"--since {text!r} is neither an ISO 8601 time nor an age like 15m, 2h or 7d") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def _ts(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def attempts(
    event: str | None = typer.Option(None, "--event", "-e", help="Only this event's attempts (its id)."),
    stream: str | None = typer.Option(None, "--stream", "-s", help="Only this stream's."),
    destination: str | None = typer.Option(None, "--destination", "-d", help="Only this destination's."),
    since: str | None = typer.Option(
        None, "--since", help="Only attempts at or after this time: ISO 8601 (UTC) or an age (90s, 15m, 2h, 7d)."
    ),
    limit: int = typer.Option(100, "--limit", min=1, max=100_000, help="Show at most this many (newest first)."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output (a JSON array)."),
    config: Path | None = ConfigOption,
) -> None:
    """Show the delivery-attempt log: each attempt's time, outcome, latency and the transport's
    detail (a webhook's status code and answer excerpt), newest first (docs/attempts.md)."""
    cfg = load(config)
    cutoff = _since(since, time.time())
    with open_existing(cfg) as outbox:
        rows = log.read(outbox.store, event_id=event, stream=stream, destination=destination, since=cutoff, limit=limit)
    secrets = secrets_of(cfg)
    for r in rows:  # what a receiver answered may quote what it was sent: never print a configured secret
        if r["error"]:
            r["error"] = mask(r["error"], secrets)
        detail = r["detail"]
        if isinstance(detail, str):
            r["detail"] = mask(detail, secrets)
        elif isinstance(detail, dict):
            r["detail"] = {k: mask(v, secrets) if isinstance(v, str) else v for k, v in detail.items()}
    if as_json:
        console.print_json(orjson.dumps(rows).decode())
        return
    if not rows:
        off = "" if cfg.attempts.enabled else " ([attempts] enabled = false in this config)"
        console.print(f"no attempts logged{off}", markup=False)
        return
    for r in rows:
        detail = r["detail"]
        shown = f"status={detail.get('status')}" if isinstance(detail, dict) and "status" in detail else ""
        if not shown and detail:
            shown = str(detail)[:80]
        latency = "-" if r["latency"] is None else f"{r['latency'] * 1000:.1f}ms"
        console.print(
            f"{_ts(r['at'])}  {r['outcome']:<13} {r['destination']:<12} event={r['event_id']} "
            f"stream={r['stream']} attempt={r['attempt']} {latency} {shown}  {r['error'] or ''}".rstrip(),
            markup=False,
            soft_wrap=True,
        )


def retry_event(cfg: OutrelayConfig, event: str, destination: str | None, redeliver: bool) -> None:
    """``outrelay retry --event ID``: send one event again now (see :func:`outrelay.core.relay.attempts.retry_event`).
    An unknown event or destination exits 2; nothing to do (delivered already) exits 1, one line each."""
    if destination is not None and destination not in cfg.destinations:
        known = ", ".join(sorted(cfg.destinations)) or "none"
        raise ConfigError(f"unknown destination {destination!r}; configured: {known}")
    if redeliver and destination is None:
        raise ConfigError("--redeliver needs --destination (where to deliver the event again)")
    with open_existing(cfg) as outbox:
        try:
            done = log.retry_event(outbox.store, event, destination=destination, redeliver=redeliver, now=time.time())
        except NotFoundError as exc:
            raise ConfigError(str(exc)) from None
    if not done:
        where = f" at {destination}" if destination else ""
        err_console.print(
            error_line(
                f"event {event} waits for nothing{where} (delivered?); "
                "--redeliver --destination D sends it again anyway"
            ),
            markup=False,
            soft_wrap=True,
        )
        raise typer.Exit(1)
    for dest, what in done:
        console.print(f"{dest}: event {event} {what} (a running relay sends it at its next poll)", markup=False)


def register(app: typer.Typer) -> None:
    app.command("attempts")(attempts)
