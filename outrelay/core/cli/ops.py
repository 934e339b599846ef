"""Operator commands: ``enable``, ``disable``, ``replay``, ``migrate``, ``conformance``, ``demo``."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from outrelay.core.cli._common import ConfigOption, console, load
from outrelay.core.config import OutrelayConfig
from outrelay.core.errors import ConfigError
from outrelay.core.outbox import Outbox

__all__ = ["register"]


def register(app: typer.Typer) -> None:
    app.command("enable")(enable)
    app.command("disable")(disable)
    app.command("replay")(replay)
    app.command("migrate")(migrate)
    app.command("conformance")(conformance)
    from outrelay.core.cli.demo import demo

    app.command("demo")(demo)
    from outrelay.core.cli.tail import tail

    app.command("tail")(tail)


def _known(cfg: OutrelayConfig, destination: str) -> None:
    if destination not in cfg.destinations:
        known = ", ".join(sorted(cfg.destinations)) or "none"
        raise ConfigError(f"unknown destination {destination!r}; configured: {known}")


def enable(destination: str = typer.Argument(...), config: Path | None = ConfigOption) -> None:
    """Re-enable a destination that was disabled (e.g. after a webhook answered 410 Gone)."""
    cfg = load(config)
    _known(cfg, destination)
    with Outbox.open(cfg.outbox.url) as outbox:
        outbox.store.set_disabled(destination, None, time.time())
    console.print(f"{destination}: enabled", markup=False)


def disable(
    destination: str = typer.Argument(...),
    reason: str = typer.Option("disabled by operator", "--reason"),
    config: Path | None = ConfigOption,
) -> None:
    """Stop delivering to a destination; its events stay pending until `outrelay enable`."""
    cfg = load(config)
    _known(cfg, destination)
    with Outbox.open(cfg.outbox.url) as outbox:
        outbox.store.set_disabled(destination, reason, time.time())
    console.print(f"{destination}: disabled ({reason})", markup=False)


def replay(
    destination: str = typer.Option(..., "--destination", "-d", help="Where to send the history again."),
    stream: str | None = typer.Option(None, "--stream", "-s", help="Only this stream (default: all)."),
    after: int = typer.Option(0, "--after", help="Only events with sequence greater than this."),
    config: Path | None = ConfigOption,
) -> None:
    """Replay history: queue already-routed events to a destination again, in order."""
    cfg = load(config)
    _known(cfg, destination)
    with Outbox.open(cfg.outbox.url) as outbox:
        n = outbox.store.replay_stream(destination, stream=stream, after=after, now=time.time())
    console.print(f"queued {n} event(s) for {destination}; a running relay delivers them", markup=False)


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
    destination: str = typer.Option(..., "--destination", "-d"),
    report_json: Path | None = typer.Option(None, "--report-json"),
    report_md: Path | None = typer.Option(None, "--report-md"),
    config: Path | None = ConfigOption,
) -> None:
    """Run the transport conformance suite against a configured destination."""
    from outrelay.conformance.runner import run_conformance
    from outrelay.core.config import default_config_path

    cfg_path = config if config is not None else default_config_path()
    load(cfg_path)  # fail early, in one line, on a bad config
    code = run_conformance(
        str(cfg_path),
        destination,
        report_json=str(report_json) if report_json else None,
        report_md=str(report_md) if report_md else None,
    )
    raise typer.Exit(int(code))
