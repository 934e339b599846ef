"""``outrelay tail``: print events from a destination as they arrive."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from outrelay.cli._common import ConfigOption, config_context, console, load
from outrelay.core.model import cloudevents
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError

if TYPE_CHECKING:
    from outrelay.core.consumer.bus import EventBus

__all__ = ["tail"]


def _line(e: Event, width: int = 120) -> str:
    data = e.data.decode("utf-8", "replace").replace("\n", " ")
    if len(data) > width:
        data = data[: width - 1] + "…"
    tenant = f" tenant={e.tenant}" if e.tenant else ""
    return f"{e.time_text} {e.type} stream={e.stream}{tenant} id={e.id} {data}"


def tail(
    destination: str | None = typer.Option(
        None, "--destination", "-d", help="Destination to read (default: $OUTRELAY_BUS, else [bus] destination)."
    ),
    types: list[str] = typer.Option([], "--type", "-t", help="Only these event types (globs; repeatable)."),
    streams: list[str] = typer.Option([], "--stream", "-s", help="Only these streams (globs; repeatable)."),
    tenants: list[str] = typer.Option([], "--tenant", help="Only these tenants (repeatable)."),
    count: int = typer.Option(0, "--count", "-n", min=0, help="Exit after this many events (0: until Ctrl-C)."),
    group: str | None = typer.Option(
        None, "--group", help="Consume as a member of this consumer group instead of watching (fan-out)."
    ),
    from_beginning: bool = typer.Option(
        False, "--from-beginning", help="Start at the oldest retained event (where the broker keeps history)."
    ),
    as_json: bool = typer.Option(False, "--json", help="One structured CloudEvent (JSON) per line."),
    config: Path | None = ConfigOption,
) -> None:
    """Print events from a destination as they arrive, filtered by type, stream and tenant.

    Watching is fan-out: it takes nothing away from consumer groups. Lines go to
    stdout; Ctrl-C (or SIGTERM) stops it.
    """
    from outrelay.core.consumer.bus import BUS_ENV, EventBus

    cfg = load(config)
    name = destination or os.environ.get(BUS_ENV) or cfg.bus.destination or "memory"
    dest = cfg.destinations.get(name)
    if name == "memory" or (dest is not None and dest.transport == "memory"):
        raise ConfigError(
            f"tail has no broker to read{f' (destination {name!r} is in-process)' if dest else ''}: the in-process "
            f"bus only sees events published inside the process that runs it, never the relay's; pass "
            f"-d DESTINATION (one whose transport offers subscriptions, see `outrelay transports`), or set "
            f"[bus] destination or ${BUS_ENV}"
        )
    with config_context(config):
        bus = EventBus.from_config(cfg, destination=destination, dead_letters="memory")
    asyncio.run(_tail(bus, types or ["*"], streams, tenants, count, group, from_beginning, as_json))


async def _tail(
    bus: EventBus, types: list[str], streams: list[str], tenants: list[str], count: int, group: str | None,
    from_beginning: bool, as_json: bool,
) -> None:  # fmt: skip
    done = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, done.set)
    seen = 0

    async def show(e: Event) -> None:
        nonlocal seen
        if count and seen >= count:
            return
        seen += 1
        if as_json:
            console.print(cloudevents.to_structured(e).decode(), markup=False, soft_wrap=True)
        else:
            console.print(_line(e), markup=False, soft_wrap=True)
        if count and seen >= count:
            done.set()

    async with bus:
        await bus.subscribe(
            show, types=types, streams=streams, tenants=tenants, group=group, name="outrelay-tail",
            from_beginning=from_beginning, max_attempts=1,
        )  # fmt: skip
        await done.wait()
