"""``run``, ``emit``, ``status``, ``check``, ``transports``."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import signal
import time
from pathlib import Path
from typing import Any, Literal

import orjson
import typer

from outrelay.cli._common import (
    ConfigOption,
    config_context,
    console,
    err_console,
    error_line,
    load,
    setup_logging,
)
from outrelay.cli._summary import startup_line, summary_doc, summary_line
from outrelay.cli._validate import outbox_problem, permanent, validate
from outrelay.core.config.registry import get_registry
from outrelay.core.contract.transport import Capabilities, Transport
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError, StoreError, StoreLockedError
from outrelay.core.relay.relay import Relay
from outrelay.core.stores.outbox import Outbox
from outrelay.plugins.crypto import PayloadCrypto, crypto_config
from outrelay.plugins.health import DEFAULT_STALL_AFTER

__all__ = ["register"]

log = logging.getLogger("outrelay.relay")

LogLevel = Literal["debug", "info", "warning", "error"]
LogFormat = Literal["text", "json"]


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("emit")(emit)
    app.command("transports")(transports)


def run(
    config: Path | None = ConfigOption,
    drain: bool = typer.Option(
        False, "--drain", help="Deliver what is pending (and retries due soon), then exit: 0 if nothing is left."
    ),
    log_level: LogLevel = typer.Option("info", "--log-level", help="Log threshold."),
    log_format: LogFormat = typer.Option("text", "--log-format", help="text, or json: one JSON object per line."),
    metrics_port: int = typer.Option(
        0,
        "--metrics-port",
        min=0,
        max=65535,
        help="Serve Prometheus /metrics, /healthz and /readyz on this port (0: off).",
    ),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address for --metrics-port."),
    ready_stall_after: float = typer.Option(
        DEFAULT_STALL_AFTER,
        "--ready-stall-after",
        min=1,
        help="/readyz fails once a destination has failed this many seconds without one success.",
    ),
) -> None:
    """Run the relay in the foreground until SIGINT/SIGTERM (or, with --drain, until idle)."""
    setup_logging(log_level, log_format)
    cfg = load(config)
    with config_context(config):
        validate(cfg)  # the whole config, before anything is created or connected
    problem = outbox_problem(cfg.outbox.url, create=True)
    if problem:
        raise StoreError(problem)
    json_mode = log_format == "json"

    async def main() -> Any:
        loop = asyncio.get_running_loop()
        stopped = asyncio.Event()
        started: list[Relay] = []

        def stop(sig: signal.Signals) -> None:
            if not stopped.is_set():
                log.info(
                    "%s received: stopping (in-flight batches get up to relay.shutdown_grace = %gs)",
                    sig.name,
                    cfg.relay.shutdown_grace,
                    extra={"signal": sig.name},
                )
            stopped.set()
            for r in started:
                r.stop()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop, sig)
        relay = await _open_relay(cfg, config, drain, stopped)
        if relay is None:
            return None
        started.append(relay)
        server = None
        if metrics_port:
            from outrelay.plugins.health import Health
            from outrelay.plugins.metrics import Metrics, serve_metrics

            metrics, health = Metrics(), Health(relay, ready_stall_after)
            relay.registry.pm.register(metrics)
            relay.registry.pm.register(health)
            try:
                server = await serve_metrics(relay, metrics, metrics_host, metrics_port, health)
            except OSError as exc:
                raise ConfigError(
                    f"--metrics-port {metrics_port}: cannot listen on {metrics_host}: {exc.strerror}"
                ) from None
        metrics_url = f"http://{metrics_host}:{metrics_port}" if metrics_port else None
        log.info("%s", startup_line(cfg, relay.transports, metrics_url))
        try:
            summary = await relay.run(drain=drain)
        finally:
            if server is not None:
                server.close()
        log.info("outrelay stopped: %s", summary_line(summary_doc(summary)))
        return summary

    summary = asyncio.run(main())
    if summary is None:
        if json_mode:
            console.print_json(orjson.dumps({"stopped": "before the outbox became available"}).decode())
        else:
            console.print("stopped before the outbox became available", markup=False)
        return
    doc = summary_doc(summary)
    line = summary_line(doc)
    incomplete = drain and bool(doc["pending"] or doc["dead_lettered"] or doc["parked"])
    if json_mode:
        doc["complete"] = not incomplete
        print(orjson.dumps(doc).decode(), flush=True)  # one line: a log shipper reads it like the logs
    if incomplete:
        from outrelay.cli.status import drain_reason

        why = drain_reason(cfg) if doc["pending"] else ""
        msg = f"drain incomplete: {line}{f' — {why}' if why else ''} — see `outrelay status` and `outrelay dlq list`"
        err_console.print(error_line(msg), markup=False, soft_wrap=True)
        raise typer.Exit(1)
    if not json_mode:
        console.print(line, markup=False)


async def _open_relay(cfg: Any, config: Path | None, drain: bool, stopped: asyncio.Event) -> Relay | None:
    """Build the relay, waiting (with a log line per attempt, backoff to 30 s) while the outbox
    cannot be opened — a database still starting or down, as the running relay does. With
    ``--drain`` the wait is bounded by ``relay.drain_retry_bound``. Returns None when stopped
    while waiting. Another relay holding a SQLite outbox, and an error that waiting does not
    cure (:func:`~outrelay.cli._validate.permanent`), are errors at once."""
    delay = 0.5
    deadline = time.monotonic() + cfg.relay.drain_retry_bound if drain else float("inf")
    while True:
        try:
            with config_context(config):
                return await asyncio.to_thread(Relay, config=cfg, registry=get_registry().copy())
        except StoreLockedError:
            raise
        except StoreError as exc:
            if time.monotonic() + delay > deadline or permanent(exc, cfg.outbox.url):
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
    tenant: str | None = typer.Option(None, "--tenant", help="Tenant id carried by the events."),
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
    encode = None
    crypto = crypto_config(cfg)
    if crypto is not None and crypto.at_rest:  # sealed at append, as the application's appends are
        with config_context(config):
            encode = PayloadCrypto.from_config(cfg).outbox_encoder
    with Outbox.open(cfg.outbox.url, max_event_bytes=cfg.outbox.max_event_bytes, encode=encode) as outbox:
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


def transports(as_json: bool = typer.Option(False, "--json", help="Machine-readable output.")) -> None:
    """List installed transports with version, origin distribution and capabilities."""
    registry = get_registry()
    docs = []
    for name, spec in sorted(registry.transports.items()):
        doc: dict[str, Any] = {"name": name, "origin": spec.origin}
        missing = spec.missing()
        if missing:
            doc["status"] = f'missing {", ".join(missing)}: pip install "outrelay[{spec.extra or name}]"'
        else:
            doc["status"] = "installed"
            caps = _default_capabilities(spec.load(), name)
            if caps is None:
                doc["capabilities"] = "depends on config"
            else:
                doc["capabilities"] = {k: getattr(caps, k) for k in caps.__dataclass_fields__}
        docs.append(doc)
    if as_json:
        console.print_json(orjson.dumps(docs).decode())
        return
    for d in docs:
        info = d.get("capabilities")
        if isinstance(info, dict):
            flags = [k for k in _FLAGS if info.get(k)]
            extra = (
                f"  [{', '.join(flags)}; batch<={info['max_batch_count']}; modes={','.join(info['cloudevents_modes'])}]"
            )
        elif info:
            extra = f"  [{info}]"
        else:
            extra = ""
        console.print(f"{d['name']:<11} {d['origin']:<28} {d['status']}{extra}", markup=False)


_FLAGS = ("ordering_by_key", "ordered_batches", "native_dedupe", "reader", "subscriptions")
#: stand-ins for options a transport requires, to show the capabilities of an otherwise default config
_SAMPLES = {
    "url": "https://example.com/hook",
    "topic": "outrelay",
    "queue": "outrelay",
    "project": "example-project",
    "topic_arn": "arn:aws:sns:us-east-1:123456789012:outrelay",
    "queue_url": "https://sqs.us-east-1.amazonaws.com/123456789012/outrelay",
    "connection_string": "Endpoint=sb://example.servicebus.windows.net/;SharedAccessKeyName=k;SharedAccessKey=v",
}


def _default_capabilities(cls: type[Transport], name: str) -> Capabilities | None:
    """The capabilities of ``cls`` with its defaults (required options filled in with stand-ins),
    or None when they cannot be known without a real config."""
    fields = cls.Config.model_fields
    required = {k: _SAMPLES.get(k, "outrelay") for k, f in fields.items() if f.is_required()}
    optional = [k for k in _SAMPLES if k in fields and k not in required]
    # e.g. Service Bus needs one of queue or topic, and one of connection_string or a namespace
    for keys in itertools.chain.from_iterable(itertools.combinations(optional, n) for n in range(3)):
        options = {**required, **{k: _SAMPLES[k] for k in keys}}
        try:
            return cls(cls.Config.model_validate(options), destination=name).capabilities
        except Exception:  # not a config this transport accepts: try the next
            continue
    return None
