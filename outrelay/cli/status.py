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
from outrelay.cli._validate import open_existing
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.model.errors import ConfigError
from outrelay.core.relay.breaker import read_states
from outrelay.core.relay.routing import UNROUTED_REASONS
from outrelay.core.relay.unrouted import read_unrouted
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
    invalid = _config_errors(cfg)
    with open_existing(cfg) as outbox:
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
            d["config_error"] = mask(invalid.get(r.destination), secrets)
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
    nowhere = read_unrouted(cfg.outbox.url)
    return {
        "outbox": mask(cfg.outbox.url, secrets),
        "unrouted": unrouted,
        "unrouted_events": nowhere,
        "destinations": docs,
    }


def _config_errors(cfg: OutrelayConfig) -> dict[str, str]:
    """Each destination whose transport cannot be built from the config (as `run` would refuse it):
    an unknown transport, a missing extra, an invalid option — by destination name."""
    from outrelay.core.config.registry import get_registry

    registry = get_registry()
    out: dict[str, str] = {}
    for name, dest in cfg.destinations.items():
        try:
            registry.create_transport(dest.transport, dest.options, destination=name)
        except ConfigError as exc:
            out[name] = str(exc).removeprefix(f"destinations.{name}: ")
    return out


def _state(d: dict[str, Any]) -> str:
    """The current state only: an error is shown while something still fails, not after recovery;
    the error shown is the latest one the relay recorded for the destination."""
    if d["config_error"]:
        return f"invalid config: {d['config_error']}"
    if d["disabled"]:
        return f"disabled: {d['disabled']}"
    if d["breaker"]:
        b = d["breaker"][0]
        return (
            f"circuit breaker open ({b['probes']} probe(s), one every {b['probe_interval']:g}s): "
            f"{b['last_error'] or 'unknown error'}"
        )
    if d["last_error"] and d["last_error"].startswith("open failed"):  # cleared once the transport opens
        return f"failing: {d['last_error']}"
    if d["retrying"]:
        return f"retrying: {d['last_error'] or d['retrying'][0]['last_error'] or 'unknown error'}"
    if d["parked"]:
        return f"parked: {d['parked'][0]['reason']}"
    return "ok"


class _Lines:
    """Lines of at most ``width`` columns; remembers whether anything was cut."""

    def __init__(self, width: int) -> None:
        self.width = width
        self.lines: list[str] = []
        self.cut = False

    def add(self, head: str, text: str | None = None) -> None:
        """``head`` whole, then ``text`` shortened to what is left of the line."""
        if text is None:
            self.lines.append(head)
            return
        room = max(10, self.width - len(head))
        one = " ".join(text.split())
        self.cut |= len(one) > room
        self.lines.append(head + _short(one, room))


def _render(doc: dict[str, Any], width: int, now: float) -> list[str]:
    out = _Lines(width)
    out.add("", f"outbox {doc['outbox']} · {doc['unrouted']} event(s) not yet routed")
    for reason, entry in sorted((doc.get("unrouted_events") or {}).items()):
        types = ", ".join(f"{t} ×{n}" for t, n in sorted(entry["types"].items(), key=lambda kv: -kv[1]))
        why = UNROUTED_REASONS.get(reason, reason)
        out.add("routed nowhere: ", f"{types} — {why}")
    out.add("")
    for d in doc["destinations"]:
        out.add(f"{d['destination']} ({d['transport']}) ", d["state"])
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
                out.add(line.rstrip(" ·"))
                line = " "
            line += f" {c} ·"
        out.add(line.rstrip(" ·"))
        for s in d["retrying"][:STREAMS_TEXT]:
            out.add(
                f"  stream {s['stream']}: attempt {s['attempts']}, next {_when(s['next_attempt_at'], now)}: ",
                s["last_error"],
            )
        for p in d["parked"][:STREAMS_TEXT]:
            out.add(
                f"  stream {p['stream']}: PARKED after {p['attempts']} attempt(s) (dlq id {p['id']}): ", p["reason"]
            )
        more = max(0, len(d["retrying"]) - STREAMS_TEXT) + max(0, len(d["parked"]) - STREAMS_TEXT)
        if more:
            out.add(f"  … {more} more stream(s): outrelay status --json")
    if out.cut:
        out.add("")
        out.add("(reasons cut to fit the terminal: `outrelay status --json` shows them whole)")
    return out.lines


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
    destination: str | None = typer.Option(
        None, "--destination", "-d", help="The destination whose retries to run now (with --event: only to it)."
    ),
    stream: str | None = typer.Option(None, "--stream", "-s", help="Only this stream (default: all)."),
    event: str | None = typer.Option(
        None, "--event", "-e", help="Send this one event again now: from backoff, dead-lettered or parked."
    ),
    redeliver: bool = typer.Option(
        False, "--redeliver", help="With --event and --destination: queue it again even if delivered there."
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Make due now what waits for a retry backoff; a running relay sends it at its next poll.
    With --event, send that one event again (docs/attempts.md)."""
    cfg = load(config)
    if event is not None:
        from outrelay.cli.attempts import retry_event

        if stream is not None:
            raise ConfigError("--event and --stream do not go together (the event names its stream)")
        retry_event(cfg, event, destination, redeliver)
        return
    if destination is None:
        raise ConfigError("give --destination D (its retries run now) or --event ID (that event is sent again)")
    if destination not in cfg.destinations:
        known = ", ".join(sorted(cfg.destinations)) or "none"
        raise ConfigError(f"unknown destination {destination!r}; configured: {known}")
    with open_existing(cfg) as outbox:
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
