"""``run``, ``emit``, ``status``, ``check``, ``transports``."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from pathlib import Path
from typing import Any

import orjson
import typer

from outrelay.core.cli._common import (
    ConfigOption,
    config_context,
    console,
    err_console,
    load,
    mask,
    secrets_of,
    setup_logging,
)
from outrelay.core.envelope import Event
from outrelay.core.errors import ConfigError, OutrelayError, StoreError, StoreLockedError
from outrelay.core.outbox import Outbox
from outrelay.core.registry import Registry
from outrelay.core.relay import Relay

__all__ = ["register"]

log = logging.getLogger("outrelay.relay")


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("emit")(emit)
    app.command("status")(status)
    app.command("check")(check)
    app.command("transports")(transports)


def run(
    config: Path | None = ConfigOption,
    drain: bool = typer.Option(
        False, "--drain", help="Deliver what is pending (and retries due soon), then exit: 0 if nothing is left."
    ),
    log_level: str = typer.Option("info", "--log-level", help="debug, info, warning or error."),
    log_format: str = typer.Option("text", "--log-format", help="text or json."),
    metrics_port: int = typer.Option(0, "--metrics-port", help="Serve Prometheus /metrics on this port (0: off)."),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address for --metrics-port."),
) -> None:
    """Run the relay in the foreground until SIGINT/SIGTERM (or, with --drain, until idle)."""
    cfg = load(config)
    setup_logging(log_level, log_format)

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        started: list[Relay] = []

        def stop() -> None:
            stopped.set()
            for r in started:
                r.stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop)
        relay = await _open_relay(cfg, config, drain, stopped)
        if relay is None:
            return None
        started.append(relay)
        server = None
        if metrics_port:
            from outrelay.plugins.metrics import Metrics, serve_metrics

            metrics = Metrics()
            relay.registry.pm.register(metrics)
            try:
                server = await serve_metrics(relay, metrics, metrics_host, metrics_port)
            except OSError as exc:
                raise ConfigError(
                    f"--metrics-port {metrics_port}: cannot listen on {metrics_host}: {exc.strerror}"
                ) from None
        try:
            return await relay.run(drain=drain)
        finally:
            if server is not None:
                server.close()

    summary = asyncio.run(main())
    if summary is None:
        console.print("stopped before the outbox became available", markup=False)
        return
    delivered = sum(c["delivered"] for c in summary.counts.values())
    dead = summary.dead_lettered
    line = f"delivered {delivered} in {summary.elapsed:.1f}s; {summary.remaining} pending; {dead} dead-lettered"
    if drain and (summary.remaining or dead):
        err_console.print(
            f"outrelay: drain incomplete: {line} — see `outrelay status` and `outrelay dlq list`", markup=False
        )
        raise typer.Exit(1)
    console.print(line, markup=False)


async def _open_relay(cfg: Any, config: Path | None, drain: bool, stopped: asyncio.Event) -> Relay | None:
    """Build the relay, waiting (with a log line per attempt, backoff to 30 s) while the outbox
    cannot be opened — a database still starting or down, as the running relay does. With
    ``--drain`` the wait is bounded by ``relay.drain_retry_bound``. Returns None when stopped
    while waiting. Another relay holding a SQLite outbox is an error at once."""
    delay = 0.5
    deadline = time.monotonic() + cfg.relay.drain_retry_bound if drain else float("inf")
    while True:
        try:
            with config_context(config):
                return await asyncio.to_thread(Relay, config=cfg)
        except StoreLockedError:
            raise
        except StoreError as exc:
            if time.monotonic() + delay > deadline:
                raise
            log.warning("outbox unavailable (%s); retrying in %.1fs", exc, delay)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopped.wait(), delay)
        if stopped.is_set():
            return None
        delay = min(delay * 2, 30.0)


def _parse_kv(items: list[str], what: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"{what} {item!r} is not KEY=VALUE")
        out[key] = value
    return out


def emit(
    type: str = typer.Option(..., "--type", "-t", help="Event type, e.g. workflow.created."),
    stream: str = typer.Option(..., "--stream", "-s", help="Ordering key, e.g. a workflow id."),
    data: str = typer.Option("null", "--data", "-d", help="JSON payload."),
    tenant: str | None = typer.Option(None, "--tenant"),
    source: str | None = typer.Option(None, "--source", help="Producer URI (default: config `source` or outrelay)."),
    label: list[str] = typer.Option([], "--label", help="KEY=VALUE, repeatable."),
    metadata: list[str] = typer.Option([], "--metadata", help="KEY=VALUE, repeatable."),
    count: int = typer.Option(1, "--count", "-n", min=1, max=10_000_000, help="Append this many events."),
    config: Path | None = ConfigOption,
) -> None:
    """Append events to the outbox from the command line (for trying things out).

    With --count N, each event's JSON object payload gets an "n" field (1..N).
    """
    cfg = load(config)
    try:
        payload = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ConfigError(f"--data is not valid JSON: {exc}") from None
    labels, meta = _parse_kv(label, "--label"), _parse_kv(metadata, "--metadata")
    src = source or cfg.source or "outrelay"
    with Outbox.open(cfg.outbox.url, max_event_bytes=cfg.outbox.max_event_bytes) as outbox:
        ids: list[str] = []
        for start in range(0, count, 1000):
            batch = []
            for n in range(start + 1, min(count, start + 1000) + 1):
                body = {**payload, "n": n} if count > 1 and isinstance(payload, dict) else payload
                batch.append(
                    Event(type=type, stream=stream, data=body, tenant=tenant, source=src, labels=labels, metadata=meta)
                )
            ids += outbox.append(batch)
    console.print(ids[0] if count == 1 else f"appended {count} events ({ids[0]} .. {ids[-1]})", markup=False)


def status(
    config: Path | None = ConfigOption,
    as_json: bool = typer.Option(False, "--json", help="Machine-readable output."),
) -> None:
    """Per destination: pending, in retry, dead-lettered, parked, oldest pending age, last error."""
    cfg = load(config)
    secrets = secrets_of(cfg)
    with Outbox.open(cfg.outbox.url) as outbox:
        rows = outbox.store.status(list(cfg.destinations), time.time())
        unrouted = outbox.store.unrouted()
    docs = []
    for r in rows:
        d = r.as_dict()
        d["last_error"] = mask(d["last_error"], secrets)
        d["disabled"] = mask(d["disabled"], secrets)
        d["transport"] = cfg.destinations[r.destination].transport
        docs.append(d)
    if as_json:
        console.print_json(orjson.dumps({"unrouted": unrouted, "destinations": docs}).decode())
        return
    from rich.table import Table

    table = Table(title=f"outbox {mask(cfg.outbox.url, secrets)} — {unrouted} not yet routed")
    for col in ("destination", "transport", "pending", "in retry", "dead", "parked", "delivered", "oldest", "state"):
        table.add_column(col)
    for d in docs:
        age = "-" if d["oldest_pending_age"] is None else f"{d['oldest_pending_age']:.0f}s"
        state = (
            f"DISABLED: {d['disabled']}"
            if d["disabled"]
            else (f"error: {d['last_error']}" if d["last_error"] else "ok")
        )
        table.add_row(
            d["destination"],
            d["transport"],
            str(d["pending"]),
            str(d["in_retry"]),
            str(d["dead_lettered"]),
            str(d["parked_streams"]),
            str(d["delivered"]),
            age,
            state,
        )
    console.print(table)


def check(
    config: Path | None = ConfigOption,
    timeout: float = typer.Option(10.0, "--timeout", help="Seconds per destination probe."),
) -> None:
    """Validate the config, open the outbox, and probe every destination (one line each)."""
    cfg = load(config)
    secrets = secrets_of(cfg)
    registry = Registry()
    failed = 0
    try:
        Outbox.open(cfg.outbox.url).close()
        console.print(f"ok    outbox       {mask(cfg.outbox.url, secrets)}", markup=False)
    except OutrelayError as exc:
        failed += 1
        console.print(f"FAIL  outbox       {mask(str(exc), secrets)}", markup=False)
    for name, dest in cfg.destinations.items():
        try:
            with config_context(config):
                transport = registry.create_transport(dest.transport, dest.options, destination=name)
            result = asyncio.run(_probe(transport, timeout))
            console.print(f"ok    {name:<12} {dest.transport}: {mask(result, secrets)}", markup=False)
        except OutrelayError as exc:
            failed += 1
            console.print(f"FAIL  {name:<12} {dest.transport}: {mask(str(exc), secrets)}", markup=False)
    if failed:
        raise typer.Exit(1)


async def _probe(transport: Any, timeout: float) -> str:
    from outrelay.core.errors import RetryableError

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


def transports(as_json: bool = typer.Option(False, "--json")) -> None:
    """List installed transports with version, origin distribution and capabilities."""
    registry = Registry()
    docs = []
    for name, spec in sorted(registry.transports.items()):
        doc: dict[str, Any] = {"name": name, "origin": spec.origin}
        missing = spec.missing()
        if missing:
            doc["status"] = f'missing {", ".join(missing)}: pip install "outrelay[{spec.extra or name}]"'
        else:
            doc["status"] = "installed"
            try:
                cls = spec.load()
                caps = cls(cls.Config(), destination=name).capabilities  # defaults, if the model has them
                doc["capabilities"] = {k: getattr(caps, k) for k in caps.__dataclass_fields__}
            except Exception:
                doc["capabilities"] = "depends on config"
        docs.append(doc)
    if as_json:
        console.print_json(orjson.dumps(docs).decode())
        return
    for d in docs:
        info = d.get("capabilities")
        if isinstance(info, dict):
            flags = [k for k in ("ordering_by_key", "ordered_batches", "native_dedupe", "reader") if info.get(k)]
            extra = (
                f"  [{', '.join(flags)}; batch<={info['max_batch_count']}; modes={','.join(info['cloudevents_modes'])}]"
            )
        elif info:
            extra = f"  [{info}]"
        else:
            extra = ""
        console.print(f"{d['name']:<11} {d['origin']:<28} {d['status']}{extra}", markup=False)
