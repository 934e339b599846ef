"""Operator commands: ``enable``, ``disable``, ``replay``, ``migrate``, ``conformance``, ``demo``."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import NoReturn

import typer

from outrelay.cli import audit
from outrelay.cli._common import ConfigOption, console, err_console, load
from outrelay.cli._validate import open_existing
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.model.errors import ConfigError, NotFoundError
from outrelay.core.stores.outbox import Outbox

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("enable")(enable)
    app.command("disable")(disable)
    app.command("replay")(replay)
    app.command("migrate")(migrate)
    app.command("conformance")(conformance)
    from outrelay.cli.demo import demo

    app.command("demo")(demo)
    from outrelay.cli.tail import tail

    app.command("tail")(tail)
    from outrelay.cli import scaffold

    scaffold.register(app)


def _known(cfg: OutrelayConfig, destination: str) -> None:
    if destination not in cfg.destinations:
        known = ", ".join(sorted(cfg.destinations)) or "none"
        raise ConfigError(f"unknown destination {destination!r}; configured: {known}")


def enable(
    destination: str = typer.Argument(..., help="A destination of the config."),
    config: Path | None = ConfigOption,
) -> None:
    """Re-enable a destination that was disabled (e.g. after a webhook answered 410 Gone)."""
    _set_disabled(config, destination, None)
    console.print(f"{destination}: enabled", markup=False)


def disable(
    destination: str = typer.Argument(..., help="A destination of the config."),
    reason: str = typer.Option("disabled by operator", "--reason", help="Shown by `outrelay status`."),
    config: Path | None = ConfigOption,
) -> None:
    """Stop delivering to a destination; its events stay pending until `outrelay enable`."""
    _set_disabled(config, destination, reason)
    console.print(f"{destination}: disabled ({reason})", markup=False)


def _set_disabled(config: Path | None, destination: str, reason: str | None) -> None:
    """Disable ``destination`` of the config at ``config`` for ``reason`` (None: enable it) and
    audit it as ``disable``/``enable``; the outbox is opened (created) if need be, since this may
    precede the first run.

    :raises ConfigError: ``destination`` is not configured."""
    cfg = load(config)
    _known(cfg, destination)
    with Outbox.open(cfg.outbox.url) as outbox:
        outbox.store.set_disabled(destination, reason, time.time())
        if reason is None:
            audit.record(cfg, "enable", {"destination": destination}, outbox.store)
        else:
            audit.record(cfg, "disable", {"destination": destination, "reason": reason}, outbox.store)


def replay(
    destination: str = typer.Option(..., "--destination", "-d", help="Where to send the history again."),
    stream: str | None = typer.Option(None, "--stream", "-s", help="Only this stream (default: all)."),
    after: int = typer.Option(0, "--after", help="Only events with sequence greater than this."),
    types: list[str] = typer.Option([], "--type", "-t", help="Only these event types (globs, repeatable)."),
    tenant: str | None = typer.Option(None, "--tenant", help="Only this tenant's events."),
    since: str | None = typer.Option(None, "--since", help="Only events at or after this time (ISO 8601, UTC)."),
    until: str | None = typer.Option(None, "--until", help="Only events before this time (ISO 8601, UTC)."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would be sent, per type; change nothing."),
    rate: float | None = typer.Option(None, "--rate", min=0.001, help="Queue at most this many events per second."),
    config: Path | None = ConfigOption,
) -> None:
    """Replay history: queue already-routed events to a destination again, in order."""
    cfg = load(config)
    _known(cfg, destination)
    if types or tenant or since or until or dry_run or rate:
        _replay_selected(cfg, destination, stream, after, types, tenant, since, until, dry_run, rate)
        return
    with open_existing(cfg) as outbox:
        _check_upcasts(outbox, stream, after)
        n = outbox.store.replay_stream(destination, stream=stream, after=after, now=time.time())
        if n:
            done = {"destination": destination, "stream": stream, "after": after, "count": n}
            audit.record(cfg, "replay", done, outbox.store)
    if n == 0:  # asked for something that is not there: say so, and exit non-zero
        what = f"no such stream {stream!r} routed to {destination}" if stream else f"nothing routed to {destination}"
        _nothing_queued(f"{what}{f' after sequence {after}' if after else ''}")
    console.print(f"queued {n} event(s) for {destination}; a running relay delivers them", markup=False)


def _nothing_queued(why: str) -> NoReturn:
    """End a replay that queued nothing: ``outrelay: error: <why>; nothing queued`` on stderr, exit 1."""
    err_console.print(f"outrelay: error: {why}; nothing queued", markup=False, soft_wrap=True)
    raise typer.Exit(1)


def _check_upcasts(outbox: Outbox, stream: str | None, after: int) -> None:
    """Before an unfiltered replay queues anything: every selected event of a type that has
    upcasters must have a path to its current version (as the filtered replay checks).

    :raises EventError: one has none (nothing is queued)."""
    from outrelay.core.history.redeliver import plan
    from outrelay.core.history.upcasting import default_upcasters
    from outrelay.core.stores.base import HistoryFilter

    upcasters = default_upcasters()
    if not upcasters:  # nothing can fail to upcast: spare the read of the whole selection
        return
    where = HistoryFilter(stream, tuple(upcasters.current), None, None, None)
    with contextlib.suppress(NotFoundError):  # no event of those types: nothing to check
        plan(outbox.store, where, after=after, upcasters=upcasters)


def _replay_selected(
    cfg: OutrelayConfig,
    destination: str,
    stream: str | None,
    after: int,
    types: list[str],
    tenant: str | None,
    since: str | None,
    until: str | None,
    dry_run: bool,
    rate: float | None,
) -> None:
    """The filtered replay (see :mod:`outrelay.core.history.redeliver`): plan first, so a
    bad selection queues nothing; then queue page by page at ``rate``."""
    from outrelay.core.history.redeliver import describe, plan, requeue
    from outrelay.core.stores.base import HistoryFilter

    where = HistoryFilter(stream, tuple(types), tenant, _when("--since", since), _when("--until", until))
    with open_existing(cfg) as outbox:
        p = plan(outbox.store, where, after=after)
        what = describe(where, after)
        if dry_run:
            console.print(
                f"dry run: {p.count} event(s) of {what} (sequences {p.first}..{p.last}) would be queued "
                f"for {destination}; nothing changed",
                markup=False,
            )
            for type_, n in p.by_type.items():
                console.print(f"  {type_}: {n}", markup=False)
            return
        from rich.progress import Progress

        with Progress(console=err_console, transient=True, disable=not err_console.is_terminal) as bar:
            task = bar.add_task(f"replaying to {destination}", total=p.count)
            n = requeue(
                outbox.store,
                destination,
                where,
                after=after,
                rate=rate,
                progress=lambda done: bar.update(task, completed=done),
            )
        if n:
            done = {"destination": destination, "selection": what, "after": after, "count": n}
            audit.record(cfg, "replay", done, outbox.store)
    if n == 0:
        _nothing_queued(f"none of the {p.count} event(s) of {what} is routed yet")
    console.print(f"queued {n} event(s) of {what} for {destination}; a running relay delivers them", markup=False)


def _when(flag: str, text: str | None) -> float | None:
    if text is None:
        return None
    from datetime import UTC, datetime

    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"{flag} {text!r} is not an ISO 8601 time; e.g. 2026-01-31T12:00:00Z") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def migrate(
    sql: bool = typer.Option(False, "--sql", help="Print the SQL instead of running it."),
    config: Path | None = ConfigOption,
) -> None:
    """Create or upgrade the outbox schema (never destructive)."""
    cfg = load(config)
    url = cfg.outbox.url
    if url.startswith("sqlite:"):
        if sql:
            from outrelay.core.stores.sqlite_schema import MIGRATIONS

            for script in MIGRATIONS:
                for stmt in script:
                    console.print(stmt.strip() + ";", markup=False)
            return
        Outbox.open(url).close()
        console.print("schema is up to date", markup=False)
        return
    try:
        from outrelay.core.stores.postgres import PostgresStore
        from outrelay.core.stores.postgres_pool import parse_url
    except ImportError as exc:
        raise ConfigError(f'the PostgreSQL outbox needs {exc.name}: pip install "outrelay[postgres]"') from None
    if sql:
        _, opts = parse_url(url, {})
        console.print(PostgresStore.migration_sql(opts["schema"], opts["prefix"]), markup=False)
    else:
        Outbox.open(url).close()
        console.print("schema is up to date", markup=False)


def conformance(
    destination: str | None = typer.Option(
        None, "--destination", "-d", help="The configured destination to certify (with --config)."
    ),
    plugins: list[str] = typer.Option(
        [], "--plugin", help="Load a transport not installed as a package: module:Class, module or file.py."
    ),
    transport: str | None = typer.Option(None, "--transport", help="Without --config: the transport's name."),
    options: list[str] = typer.Option(
        [], "--option", "-o", help="Without --config: a transport option key=value (repeatable)."
    ),
    unreachable: list[str] = typer.Option(
        [], "--unreachable", help="Option override key=value pointing at a dead endpoint (broker-down checks)."
    ),
    endpoint: str | None = typer.Option(
        None,
        "--endpoint",
        help="HOST_OPTION,PORT_OPTION, or URL_OPTION: the options naming the broker (enables the fault checks).",
    ),
    conformance_config: Path | None = typer.Option(
        None, "--conformance-config", help="A TOML file with every test hook ([conformance] table; see the docs)."
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", min=0.1, help="Bound on each open/send/close/check call (s; default 10)."
    ),
    read_timeout: float | None = typer.Option(
        None, "--read-timeout", min=0.1, help="How long a check waits to read (s; default 10)."
    ),
    isolate: bool = typer.Option(True, "--isolate/--no-isolate", help="Try a fresh target per check."),
    report_json: Path | None = typer.Option(None, "--report-json", help="Also write the report as JSON here."),
    report_md: Path | None = typer.Option(None, "--report-md", help="Also write the report as Markdown here."),
    config: Path | None = ConfigOption,
) -> None:
    """Run the transport conformance suite against a configured destination or a plugin's transport.

    With --config (or outrelay.toml present) and --destination, the destination as configured;
    or, without a config, --plugin module:Class with --option key=value for its options.
    """
    from outrelay.conformance.runner import parse_option, run_conformance
    from outrelay.core.config.config import default_config_path

    cfg_path: Path | None = config
    if cfg_path is None and (destination is not None or not plugins) and transport is None:
        cfg_path = default_config_path()
    if cfg_path is not None:
        if options:
            raise ConfigError("--option describes a destination without a config; put options in the config file")
        load(cfg_path)  # fail early, in one line, on a bad config
        if destination is None:
            raise ConfigError("name the destination to certify: --destination NAME", where=str(cfg_path))
    code = run_conformance(
        str(cfg_path) if cfg_path is not None else None,
        destination,
        report_json=str(report_json) if report_json else None,
        report_md=str(report_md) if report_md else None,
        isolate=None if isolate else False,
        read_timeout=read_timeout,
        timeout=timeout,
        plugins=plugins,
        transport=transport,
        options=dict(parse_option(o) for o in options),
        unreachable=dict(parse_option(o) for o in unreachable) if unreachable else None,
        endpoint=_endpoint(endpoint),
        conformance_config=str(conformance_config) if conformance_config else None,
    )
    raise typer.Exit(int(code))


def _endpoint(text: str | None) -> tuple[str, ...] | None:
    if text is None:
        return None
    names = tuple(n.strip() for n in text.split(","))
    if len(names) > 2 or not all(names):
        raise ConfigError(
            f"--endpoint {text!r} must name the host and port options (host,port) or the one option holding a URL (url)"
        )
    return names
