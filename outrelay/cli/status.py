"""``outrelay status`` and ``outrelay retry``: what waits, why, and "retry now".

The text form fits the terminal (80 columns included): a destination's name is
never cut, each error is shortened to one line, and a stream is shown in one
state only — *waiting for a retry* (with its attempts, next attempt and last
error) or *parked* (stopped until an operator replays or purges its head).
Dead-lettered events were set aside while their stream went on; they are
counted apart from parked streams.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson
import typer

from outrelay.cli._common import ConfigOption, console, err_console, error_line, load, mask, secrets_of
from outrelay.core.breaker import read_states
from outrelay.core.config import OutrelayConfig
from outrelay.core.errors import ConfigError
from outrelay.core.outbox import Outbox
from outrelay.core.stores.lanes import LaneOperations

__all__ = ["register", "retry", "status"]

#: streams listed per destination in the text form (the JSON form lists up to STREAMS_JSON)
STREAMS_TEXT = 5
STREAMS_JSON = 100


def register(app: typer.Typer) -> None:
    app.command("status")(status)
    app.command("retry")(retry)


def _short(text: str | None, width: int) -> str:
    """One line of at most ``width`` characters (whitespace collapsed, cut with an ellipsis)."""
    one = " ".join((text or "").split())
    return one if len(one) <= width else one[: max(1, width - 1)] + "…"


def _when(t: float | None, now: float) -> str:
    if t is None:
        return "-"
    d = t - now
    if abs(d) < 1:
        return "now"
    return f"in {d:.0f}s" if d > 0 else f"{-d:.0f}s ago"


def _collect(cfg: OutrelayConfig, now: float) -> dict[str, Any]:
    secrets = secrets_of(cfg)
    with Outbox.open(cfg.outbox.url) as outbox:
        store = outbox.store
        rows = store.status(list(cfg.destinations), now)
        unrouted = store.unrouted()
        breakers = read_states(cfg.outbox.url, now)
        docs = []
        for r in rows:
            d = r.as_dict()
            d["transport"] = cfg.destinations[r.destination].transport
            d["last_error"] = mask(d["last_error"], secrets)
            d["disabled"] = mask(d["disabled"], secrets)
            # open circuit breakers of the running relays (none: closed, or no relay runs)
            d["breaker"] = [
                {**b, "last_error": mask(b.get("last_error"), secrets)} for b in breakers.get(r.destination, [])
            ]
            stuck = store.stuck_streams(r.destination, limit=STREAMS_JSON) if isinstance(store, LaneOperations) else []
            d["retrying"] = [{**s.as_dict(), "last_error": mask(s.last_error, secrets)} for s in stuck]
            parked = store.dead_letters(destination=r.destination, states=("parked",), limit=STREAMS_JSON)
            d["parked"] = [{**p.summary(), "reason": mask(p.reason, secrets)} for p in parked]
            d["state"] = _state(d)
            docs.append(d)
    return {"outbox": mask(cfg.outbox.url, secrets), "unrouted": unrouted, "destinations": docs}


def _state(d: dict[str, Any]) -> str:
    """The current state only: an error is shown while something still fails, not after recovery."""
    if d["disabled"]:
        return f"disabled: {d['disabled']}"
    if d["breaker"]:
        b = d["breaker"][0]
        return (
            f"circuit breaker open ({b['probes']} probe(s), one every {b['probe_interval']:g}s): "
            f"{b['last_error'] or 'unknown error'}"
        )
    if d["retrying"]:
        return f"retrying: {d['retrying'][0]['last_error'] or d['last_error'] or 'unknown error'}"
    if d["parked"]:
        return f"parked: {d['parked'][0]['reason']}"
    return "ok"


def _render(doc: dict[str, Any], width: int, now: float) -> list[str]:
    lines = [_short(f"outbox {doc['outbox']} · {doc['unrouted']} event(s) not yet routed", width), ""]
    for d in doc["destinations"]:
        head = f"{d['destination']} ({d['transport']})"
        lines.append(head + " " + _short(d["state"], max(10, width - len(head) - 1)))
        age = "-" if d["oldest_pending_age"] is None else f"{d['oldest_pending_age']:.0f}s"
        counts = [
            f"pending {d['pending']}",
            f"retrying {len(d['retrying'])} stream(s)",
            f"parked {len(d['parked'])} stream(s)",
            f"dead-lettered {d['dead_lettered']}",
            f"delivered {d['delivered']}",
            f"oldest {age}",
        ]
        line = " "
        for c in counts:  # wrap between fields, never inside one
            if len(line) + len(c) + 3 > width and line.strip():
                lines.append(line.rstrip(" ·"))
                line = " "
            line += f" {c} ·"
        lines.append(line.rstrip(" ·"))
        for s in d["retrying"][:STREAMS_TEXT]:
            tag = f"  stream {s['stream']}: attempt {s['attempts']}, next {_when(s['next_attempt_at'], now)}: "
            lines.append(tag + _short(s["last_error"], max(10, width - len(tag))))
        for p in d["parked"][:STREAMS_TEXT]:
            tag = f"  stream {p['stream']}: PARKED after {p['attempts']} attempt(s) (dlq id {p['id']}): "
            lines.append(tag + _short(p["reason"], max(10, width - len(tag))))
        more = max(0, len(d["retrying"]) - STREAMS_TEXT) + max(0, len(d["parked"]) - STREAMS_TEXT)
        if more:
            lines.append(f"  … {more} more stream(s): outrelay status --json")
    return lines


def status(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output, every waiting stream included."),
) -> None:
    """Per destination: its state, pending, retrying and parked streams, dead letters, and why."""
    cfg = load(config)
    now = time.time()
    doc = _collect(cfg, now)
    if as_json:
        console.print_json(orjson.dumps(doc).decode())
        return
    for line in _render(doc, console.width, now):
        console.print(line, markup=False, soft_wrap=True)


def retry(
    destination: str = typer.Option(..., "--destination", "-d", help="The destination whose retries to run now."),
    stream: str | None = typer.Option(None, "--stream", "-s", help="Only this stream (default: all)."),
    config: Path | None = ConfigOption,
) -> None:
    """Make due now what waits for a retry backoff; a running relay sends it at its next poll."""
    cfg = load(config)
    if destination not in cfg.destinations:
        known = ", ".join(sorted(cfg.destinations)) or "none"
        raise ConfigError(f"unknown destination {destination!r}; configured: {known}")
    with Outbox.open(cfg.outbox.url) as outbox:
        store = outbox.store
        if not isinstance(store, LaneOperations):
            raise ConfigError(f"the outbox store {type(store).__name__} does not support `outrelay retry`")
        n = store.retry_now(destination, stream=stream, now=time.time())
    if n == 0:
        what = f"stream {stream!r} of {destination}" if stream else destination
        err_console.print(error_line(f"nothing waits for a retry at {what}; see `outrelay status`"), markup=False)
        raise typer.Exit(1)
    console.print(f"{destination}: {n} stream(s) due now (a running relay retries them at its next poll)", markup=False)


def drain_reason(cfg: OutrelayConfig) -> str:
    """Why a drain left work: the soonest retry beyond ``relay.drain_retry_bound``, parked streams,
    disabled destinations — one short clause each (empty when the outbox cannot say)."""
    now = time.time()
    try:
        doc = _collect(cfg, now)
    except Exception:  # the summary line already says what is left; the reason is a bonus
        return ""
    reasons = []
    soonest = min(
        ((s["next_attempt_at"], d["destination"], s["stream"]) for d in doc["destinations"] for s in d["retrying"]),
        default=None,
    )
    if soonest is not None:
        at, dest, stream = soonest
        bound = cfg.relay.drain_retry_bound
        why = f"beyond relay.drain_retry_bound = {bound:g}s" if at - now > bound else "but the drain was stopped"
        reasons.append(
            f"the next retry ({dest}, stream {stream}) is due {_when(at, now)}, {why} "
            f"(`outrelay retry -d {dest}` makes it due now)"
        )
    parked = sum(len(d["parked"]) for d in doc["destinations"])
    if parked:
        reasons.append(f"{parked} stream(s) parked until `outrelay dlq replay`")
    disabled = [d["destination"] for d in doc["destinations"] if d["disabled"]]
    if disabled:
        reasons.append(f"disabled: {', '.join(disabled)}")
    return "; ".join(reasons)
