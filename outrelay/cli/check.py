"""``outrelay check``: validate the config as ``run`` does, then (unless ``--offline``) open the outbox and
probe every destination — one line each, every problem listed, not only the first."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import typer

from outrelay.cli._common import ConfigOption, config_context, console, load, mask, secrets_of
from outrelay.cli._validate import outbox_problem, validate
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.contract.transport import Transport
from outrelay.core.model.errors import OutrelayError, RetryableError, StoreError
from outrelay.core.stores.outbox import Outbox

__all__ = ["check", "register"]


def register(app: typer.Typer) -> None:
    app.command("check")(check)


def check(
    config: Path | None = ConfigOption,
    timeout: float = typer.Option(10.0, "--timeout", min=0.1, help="Seconds per destination probe."),
    offline: bool = typer.Option(
        False, "--offline", help="Only validate the config and every destination's options: connect to nothing."
    ),
) -> None:
    """Validate the config, open the outbox, and probe every destination (one line each).

    The whole config is validated first, as `run` does (exit 2 on any problem, nothing created); then
    the outbox is opened (the line says whether that created it) and every destination probed: exit 1
    when anything fails. With --offline nothing is opened or created."""
    cfg = load(config)
    with config_context(config):
        transports = validate(cfg)
    secrets = secrets_of(cfg)
    if offline:
        console.print(f"skip  outbox       {mask(cfg.outbox.url, secrets)} (--offline: not opened)", markup=False)
        for name, dest in cfg.destinations.items():
            console.print(f"ok    {name:<12} {dest.transport}: options valid (--offline: not probed)", markup=False)
        return
    failed = 0
    try:
        console.print(f"ok    outbox       {_open_outbox(cfg, secrets)}", markup=False)
    except OutrelayError as exc:
        failed += 1
        console.print(f"FAIL  outbox       {mask(str(exc), secrets)}", markup=False)
    for name, dest in cfg.destinations.items():
        try:
            result = asyncio.run(_probe(transports[name], timeout))
            console.print(f"ok    {name:<12} {dest.transport}: {mask(result, secrets)}", markup=False)
        except OutrelayError as exc:
            failed += 1
            console.print(f"FAIL  {name:<12} {dest.transport}: {mask(str(exc), secrets)}", markup=False)
    if failed:
        raise typer.Exit(1)


def _open_outbox(cfg: OutrelayConfig, secrets: list[str]) -> str:
    """Open (and so create or migrate) the outbox; the line says whether a SQLite file was created."""
    url = cfg.outbox.url
    problem = outbox_problem(url, create=True)
    if problem:
        raise StoreError(problem)
    created = False
    if url.startswith("sqlite:"):
        from outrelay.core.stores.sqlite import path_from_url

        with contextlib.suppress(StoreError):  # a bad URL: Outbox.open reports it below
            created = not Path(path_from_url(url)).exists()
    Outbox.open(url).close()
    note = " (created: a new SQLite outbox)" if created else ""
    return f"{mask(url, secrets)}{note}"


async def _probe(transport: Transport, timeout: float) -> str:
    try:
        return str(await asyncio.wait_for(transport.check(), timeout))
    except TimeoutError:
        raise RetryableError(f"no answer within {timeout:.0f}s (is the broker reachable?)") from None
    except OutrelayError:
        raise
    except Exception as exc:  # a transport that leaked a vendor error: still one line
        raise RetryableError(f"{type(exc).__name__}: {exc}") from None
    finally:
        with contextlib.suppress(Exception):
            await transport.close()
