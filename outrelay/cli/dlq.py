"""``outrelay dlq``: list, show, replay and purge dead letters."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
import typer

from outrelay.cli import audit
from outrelay.cli._common import ConfigOption, command_group, console, load, mask, secrets_of
from outrelay.cli._validate import open_existing
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.consumer.consumer_dlq import ConsumerDeadLetters
from outrelay.core.model import cloudevents
from outrelay.core.model.errors import ConfigError, NotFoundError
from outrelay.plugins.crypto import reveal

if TYPE_CHECKING:
    from outrelay.core.stores.base import Store

__all__ = ["app"]

app = command_group(
    "Inspect, replay and purge dead letters: the relay's (per destination) and, with --consumer, "
    "the subscribers' (per consumer group or subscription)."
)

ConsumerOption = typer.Option(
    None,
    "--consumer",
    help="Consumer-side dead letters of this consumer group/subscription ('all': every consumer).",
    show_default=False,
)


@contextmanager
def _consumers(cfg: OutrelayConfig) -> Iterator[ConsumerDeadLetters]:
    """The consumer dead letters of ``cfg`` (``[bus] dead_letters``, else the outbox database), closed after.

    :raises ConfigError: that database is a SQLite file that does not exist (a mistyped path is
        reported, never created)."""
    url = cfg.bus.dead_letters or cfg.outbox.url
    if url.startswith("sqlite:///") and not Path(url[len("sqlite:///") :]).exists():
        key = "bus.dead_letters" if cfg.bus.dead_letters else "outbox.url, where they are kept by default"
        raise ConfigError(f"no consumer dead-letter database at {url[len('sqlite:///') :]!r} ({key})")
    dlq = ConsumerDeadLetters(url)
    try:
        yield dlq
    finally:
        dlq.close()


def _consumer_filter(consumer: str) -> str | None:
    return None if consumer == "all" else consumer


def _ts(t: float | None) -> str:
    return "-" if t is None else datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@app.command("list")
def list_(
    destination: str | None = typer.Option(None, "--destination", "-d", help="Only this destination's."),
    limit: int = typer.Option(100, "--limit", min=1, help="Show at most this many."),
    include_replayed: bool = typer.Option(False, "--include-replayed", help="Also those already replayed."),
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
    consumer: str | None = ConsumerOption,
    config: Path | None = ConfigOption,
) -> None:
    """List dead letters (and parked streams' heads), oldest first."""
    cfg = load(config)
    secrets = secrets_of(cfg)
    states = ("dead", "parked", "replayed") if include_replayed else ("dead", "parked")
    if consumer is not None:
        _list_consumer(cfg, consumer, states, limit, as_json)
        return
    with open_existing(cfg) as outbox:
        rows = outbox.store.dead_letters(destination=destination, states=states, limit=limit)
    _print_rows(rows, secrets, as_json, "no dead letters", _relay_line)


def _relay_line(d: dict[str, Any]) -> str:
    return (
        f"{d['id']:>6}  {d['state']:<8} {d['destination']:<12} {d['type']:<24} stream={d['stream']} "
        f"attempts={d['attempts']} failed={_ts(d['failed_at'])}  {d['reason']}"
    )


def _list_consumer(cfg: OutrelayConfig, consumer: str, states: tuple[str, ...], limit: int, as_json: bool) -> None:
    with _consumers(cfg) as dlq:
        rows = dlq.entries(consumer=_consumer_filter(consumer), states=states, limit=limit)
    _print_rows(rows, secrets_of(cfg), as_json, "no consumer dead letters", _consumer_line)


def _consumer_line(d: dict[str, Any]) -> str:
    return (
        f"{d['id']:>6}  {d['state']:<8} {d['consumer']:<16} {d['type'] or '(not an event)':<24} "
        f"stream={d['stream']} attempts={d['attempts']} failed={_ts(d['failed_at'])} member={d['member']}  "
        f"{d['reason']}"
    )


def _print_rows(
    rows: Sequence[Any], secrets: list[str], as_json: bool, none: str, line: Callable[[dict[str, Any]], str]
) -> None:
    """Print dead letters ``rows`` (relay or consumer ones: each has ``summary()`` and ``reason``)
    with their reasons masked: as one JSON array, else ``none`` when there are none, else
    ``line(summary)`` for each, oldest first as given."""
    docs = [{**r.summary(), "reason": mask(r.reason, secrets)} for r in rows]
    if as_json:
        console.print_json(orjson.dumps(docs).decode())
        return
    if not docs:
        console.print(none, markup=False)
        return
    for d in docs:
        console.print(line(d), markup=False, soft_wrap=True)


@app.command("show")
def show(
    dl_id: int = typer.Argument(..., metavar="ID", help="Dead-letter id, as `outrelay dlq list` shows it."),
    consumer: str | None = typer.Option(
        None,
        "--consumer",
        help="ID is a consumer-side dead letter of this consumer group/subscription ('all': of any consumer).",
        show_default=False,
    ),
    config: Path | None = ConfigOption,
) -> None:
    """Show one dead letter with its whole event (CloudEvents JSON)."""
    cfg = load(config)
    if consumer is not None:
        with _consumers(cfg) as dlq:
            cdl = dlq.get(dl_id)
        if consumer != "all" and cdl.consumer != consumer:
            raise NotFoundError(
                f"consumer dead letter {dl_id} belongs to consumer {cdl.consumer!r}, not {consumer!r} "
                "(`--consumer all` shows it)"
            )
        body: object = orjson.loads(cdl.body) if cdl.type else cdl.body.decode("utf-8", "replace")
        doc = {**cdl.summary(), "reason": mask(cdl.reason, secrets_of(cfg)), "event": body}
        if cdl.type and isinstance(body, dict) and body.get("keyid"):  # sealed: decrypt if the keys are here
            event, doc["encryption"] = reveal(cfg, cloudevents.from_structured(cdl.body))
            doc["event"] = orjson.loads(cloudevents.to_structured(event))
        console.print_json(orjson.dumps(doc).decode())
        return
    with open_existing(cfg) as outbox:
        dl = outbox.store.dead_letter(dl_id)
    event, note = reveal(cfg, dl.event)  # sealed at rest: decrypted if the keys are here
    doc = {
        **dl.summary(),
        "reason": mask(dl.reason, secrets_of(cfg)),
        "event": orjson.loads(cloudevents.to_structured(event)),
    }
    if note:
        doc["encryption"] = note
    console.print_json(orjson.dumps(doc).decode())


def _select(ids: list[int], all_: bool) -> list[int] | None:
    if all_ and ids:
        raise ConfigError("give dead-letter IDs or --all, not both")
    if not all_ and not ids:
        raise ConfigError("give dead-letter IDs (see `outrelay dlq list`) or --all")
    return None if all_ else ids


@app.command("replay")
def replay(
    ids: list[int] = typer.Argument(None, metavar="[ID]...", help="Dead-letter ids (or --all)."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter (of --destination, if given)."),
    destination: str | None = typer.Option(None, "--destination", "-d", help="Only this destination's."),
    consumer: str | None = ConsumerOption,
    config: Path | None = ConfigOption,
) -> None:
    """Queue dead letters for delivery again (a parked stream resumes from its head).

    With --consumer, a running member of that consumer hands them to its handler again."""
    cfg = load(config)
    selected = _select(ids or [], all_)
    n = _apply(
        cfg,
        "dlq.replay",
        selected,
        consumer,
        destination,
        lambda dlq, of: dlq.replay(selected, consumer=of),
        lambda store: store.replay_dead(selected, destination=destination, now=time.time()),
    )
    if consumer is not None:
        console.print(f"queued {n} consumer dead letter(s); a running member handles them again", markup=False)
    else:
        console.print(f"queued {n} dead letter(s) for delivery; a running relay picks them up", markup=False)


def _apply(
    cfg: OutrelayConfig,
    action: str,
    selected: list[int] | None,
    consumer: str | None,
    destination: str | None,
    on_consumers: Callable[[ConsumerDeadLetters, str | None], int],
    on_store: Callable[[Store], int],
) -> int:
    """Apply an operation to the ``selected`` dead letters and audit it as ``action``: with
    ``consumer``, ``on_consumers(dead letters, consumer or None for 'all')`` on the consumer dead
    letters, else ``on_store(store)`` on the relay's (of ``destination``, if given). Returns the
    count it returned."""
    if consumer is not None:
        with _consumers(cfg) as dlq:
            n = on_consumers(dlq, _consumer_filter(consumer))
        audit.record(cfg, action, {"consumer": consumer, "ids": selected, "count": n})
        return n
    with open_existing(cfg) as outbox:
        n = on_store(outbox.store)
        audit.record(cfg, action, {"destination": destination, "ids": selected, "count": n}, outbox.store)
    return n


@app.command("purge")
def purge(
    ids: list[int] = typer.Argument(None, metavar="[ID]...", help="Dead-letter ids (or --all)."),
    all_: bool = typer.Option(False, "--all", help="Every dead letter (of --destination, if given)."),
    destination: str | None = typer.Option(None, "--destination", "-d", help="Only this destination's."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    consumer: str | None = ConsumerOption,
    config: Path | None = ConfigOption,
) -> None:
    """Delete dead letters for good (purging a parked one skips that event and resumes the stream)."""
    cfg = load(config)
    selected = _select(ids or [], all_)
    of = destination or consumer
    if not yes and not sys.stdin.isatty():  # a confirmation nobody can answer would just abort
        raise ConfigError("purge asks for confirmation and stdin is not a terminal: add --yes (-y) to purge")
    if not yes:
        what = "ALL dead letters" if selected is None else f"{len(selected)} dead letter(s)"
        typer.confirm(f"Purge {what}{' of ' + of if of else ''}?", abort=True)
    n = _apply(
        cfg,
        "dlq.purge",
        selected,
        consumer,
        destination,
        lambda dlq, of: dlq.purge(selected, consumer=of),
        lambda store: store.purge_dead(selected, destination=destination),
    )
    console.print(f"purged {n} {'consumer ' if consumer is not None else ''}dead letter(s)", markup=False)
