"""OpenTelemetry tracing for the relay (``pip install 'outrelay[otel]'``).

A built-in plugin: it observes ``outrelay_relay_started``/``stopped`` and
``outrelay_batch_settled`` (one call per batch) and does nothing unless
tracing is on — ``[tracing] enabled = true`` in the relay's config,
``OUTRELAY_TRACING=1``, or :func:`enable_tracing` in an embedding process.
The producer and subscriber halves (trace context stored at append, CONSUMER
spans around handlers) live in :mod:`outrelay.core.model.tracecontext`.

Spans per batch a destination sends, recorded after settlement with the
batch's real start and end times (the send path itself runs no tracing code)::

    outrelay.route   INTERNAL  one routing pass (attribute outrelay.routed_events);
                               routing is one SQL statement over rows it does not
                               decode, so it starts its own trace, unlinked
    outrelay.claim   INTERNAL  claiming the batch; links to every producer's span
    outrelay.send    PRODUCER  one per event that carries a traceparent, child of
                               the producer's span (the span current at append),
                               linked to the claim; status ERROR when not delivered
    outrelay.settle  INTERNAL  writing the outcomes; links to every producer's span

Attributes: ``messaging.system`` (``kafka``, ``rabbitmq``, ``aws_sqs``, ...,
else the transport's name), ``messaging.destination.name`` (the topic,
subject or queue; the destination's name for URL targets, which may hold
credentials), ``messaging.operation.type``, ``cloudevents.event_id``,
``cloudevents.event_type``, ``outrelay.destination``,
``outrelay.attempt`` and ``outrelay.outcome`` (``delivered``, ``duplicate``,
``retry``, ``rejected``). Links per span are capped at :data:`MAX_LINKS`.

``[tracing] exporter``: ``global`` uses the process's tracer provider (set
it up yourself, or run under ``opentelemetry-instrument``); ``console`` and
``otlp`` make the relay install an SDK provider of its own, flushed and shut
down when the relay stops.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from outrelay.core.config.hookspecs import ConfigView, hookimpl
from outrelay.core.contract.transport import Delivered, Message, Rejected, RetryLater, SendResult
from outrelay.core.model import tracecontext

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider

__all__ = ["MAX_LINKS", "TracingConfig", "disable_tracing", "enable_tracing", "tracing_config"]

log = logging.getLogger("outrelay.relay")

#: most links one claim/settle span carries (the SDK's default span limit)
MAX_LINKS = 128

#: transport name -> OpenTelemetry ``messaging.system`` value, where the conventions define one
_SYSTEMS = {
    "kafka": "kafka",
    "rabbitmq": "rabbitmq",
    "sqs": "aws_sqs",
    "sns": "aws.sns",
    "pubsub": "gcp_pubsub",
    "servicebus": "servicebus",
    "pulsar": "pulsar",
}

_systems: dict[str, str] = {}  # destination -> messaging.system, filled as relays start
_owned: dict[int, Any] = {}  # id(relay) -> the provider it installed (or None) when that relay turned tracing on


class TracingConfig(BaseModel):
    """The ``[tracing]`` table: OpenTelemetry spans (``outrelay[otel]``, see
    :mod:`outrelay.plugins.otel` and docs/tracing.md). Off by default (costs nothing then)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(
        False,
        description="trace the relay (claim, send per event, settle spans linked to each producer's span) and "
        "stamp appended events with the current span's W3C trace context; needs `pip install 'outrelay[otel]'`",
    )
    exporter: Literal["global", "console", "otlp"] = Field(
        "global",
        description="where spans go: `global` (the process's OpenTelemetry tracer provider, e.g. set up by "
        "`opentelemetry-instrument` or the embedding application), `console` (stdout, for trying it out) or "
        "`otlp` (OTLP/HTTP, configured by the standard `OTEL_EXPORTER_OTLP_*` variables; needs "
        "`pip install opentelemetry-exporter-otlp-proto-http`)",
    )
    service_name: str = Field(
        "outrelay", min_length=1, description="`service.name` of the spans when `exporter` is console or otlp"
    )

    @model_validator(mode="after")
    def _installed(self) -> TracingConfig:
        if not self.enabled:
            return self
        import importlib

        try:
            importlib.import_module("opentelemetry.trace")
        except ImportError:
            raise ValueError(
                "enabled = true needs OpenTelemetry, which is not installed: pip install 'outrelay[otel]'"
            ) from None
        if self.exporter == "otlp":
            try:
                importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
            except ImportError:
                raise ValueError(
                    "exporter = 'otlp' needs the OTLP exporter, which is not installed: "
                    "pip install opentelemetry-exporter-otlp-proto-http"
                ) from None
        return self


def tracing_config(config: ConfigView) -> TracingConfig:
    """The ``[tracing]`` section of ``config`` (the defaults, tracing off, when the file has none)."""
    return config.section("tracing", TracingConfig) or TracingConfig()


@hookimpl
def outrelay_config_sections() -> dict[str, type[BaseModel]]:
    """This plugin owns ``[tracing]``."""
    return {"tracing": TracingConfig}


@hookimpl
def outrelay_bus_configured(config: ConfigView) -> None:
    """``[tracing] enabled = true`` turns tracing on for a bus's process: handlers continue
    producers' traces. Spans go to OpenTelemetry's global provider (``[tracing] exporter``
    configures the relay's own provider only).

    :raises MissingExtraError: OpenTelemetry is not installed.
    """
    if tracing_config(config).enabled and not tracecontext.active:
        tracecontext.enable()


def enable_tracing(tracer_provider: TracerProvider | None = None) -> None:
    """Turn tracing on in this process (producer stamping, relay spans,
    subscriber spans); spans go to ``tracer_provider`` or the global one.

    :raises MissingExtraError: OpenTelemetry is not installed (the message has the pip line).
    """
    tracecontext.enable(tracer_provider)


def disable_tracing() -> None:
    """Turn tracing off in this process."""
    tracecontext.disable()


def _own_provider(cfg: TracingConfig) -> Any:
    """An SDK provider exporting as ``cfg.exporter`` says (None for ``global``)."""
    if cfg.exporter == "global":
        return None
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

    exporter: SpanExporter
    if cfg.exporter == "console":
        exporter = ConsoleSpanExporter(out=sys.stdout)  # the stdout of now, not of import time
    else:
        import importlib

        mod = importlib.import_module("opentelemetry.exporter.otlp.proto.http.trace_exporter")
        exporter = mod.OTLPSpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": cfg.service_name}))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


@hookimpl
def outrelay_relay_started(relay: Any) -> None:
    for name, transport in relay.transports.items():
        _systems[name] = _SYSTEMS.get(transport.name, transport.name)
    cfg = tracing_config(relay.config)
    if not cfg.enabled or tracecontext.active:
        return
    try:  # the config check already found OpenTelemetry; a failure here must not stop delivery
        provider = _own_provider(cfg)
        tracecontext.enable(provider)
    except Exception as exc:
        log.error("tracing not started: %s: %s; the relay runs untraced", type(exc).__name__, exc)
        return
    _owned[id(relay)] = provider


@hookimpl
def outrelay_relay_stopped(relay: Any) -> None:
    if id(relay) not in _owned:
        return
    provider = _owned.pop(id(relay))
    tracecontext.disable()
    if provider is not None:
        provider.shutdown()  # flushes what the batch processor still holds


@hookimpl
def outrelay_batch_settled(
    destination: str,
    messages: Sequence[Message],
    results: Sequence[SendResult],
    timeline: tuple[float, float, float, float, float],
) -> None:
    if not tracecontext.active:
        return
    try:
        _record_batch(destination, messages, results, timeline)
    except Exception as exc:  # a tracing bug must not cost the other plugins (metrics) their call
        log.warning("tracing: spans of a batch to %s were not recorded: %s: %s", destination, type(exc).__name__, exc)


@hookimpl
def outrelay_routed(count: int, started: float, finished: float) -> None:
    if not tracecontext.active:
        return
    try:
        span = tracecontext.tracer().start_span(
            "outrelay.route", attributes={"outrelay.routed_events": count}, start_time=int(started * 1e9)
        )
        span.end(end_time=int(finished * 1e9))
    except Exception as exc:  # a tracing bug must not stop routing
        log.warning("tracing: a route span was not recorded: %s: %s", type(exc).__name__, exc)


def _outcome(result: SendResult) -> tuple[str, str | None]:
    if isinstance(result, Delivered):
        return ("duplicate" if result.duplicate else "delivered"), None
    if isinstance(result, RetryLater):
        return "retry", result.error
    if isinstance(result, Rejected):
        return "rejected", result.reason
    return type(result).__name__, None


def _parents(messages: Sequence[Message]) -> list[Any]:
    """Each message's producer context (None: untraced), parsed once per distinct traceparent
    (a batch often holds many events appended under one span)."""
    seen: dict[tuple[str, str | None], Any] = {}
    out: list[Any] = []
    for m in messages:
        meta = m.event.metadata
        tp = meta.get("traceparent")
        if tp is None:
            out.append(None)
            continue
        key = (tp, meta.get("tracestate"))
        if key not in seen:
            seen[key] = tracecontext.parent_context(meta)
        out.append(seen[key])
    return out


def _record_batch(
    destination: str,
    messages: Sequence[Message],
    results: Sequence[SendResult],
    timeline: tuple[float, float, float, float, float],
) -> None:
    from opentelemetry import trace
    from opentelemetry.trace import Link, SpanKind, Status, StatusCode

    tracer = tracecontext.tracer()
    claim0, claim1, send0, send1, settled = (int(t * 1e9) for t in timeline)
    system = _systems.get(destination, "outrelay")
    parents = _parents(messages)
    distinct = {id(p): p for p in parents if p is not None}.values()  # contexts are not hashable
    links = [Link(trace.get_current_span(p).get_span_context()) for p in distinct][:MAX_LINKS]
    batch: dict[str, str | int] = {
        "messaging.system": system,
        "outrelay.destination": destination,
        "messaging.batch.message_count": len(messages),
    }
    claim = tracer.start_span("outrelay.claim", links=links, attributes=batch, start_time=claim0 or send0)
    claim.end(end_time=claim1 or send0)
    to_claim = [Link(claim.get_span_context())]
    for m, r, parent in zip(messages, results, parents, strict=True):
        if parent is None:
            continue
        outcome, error = _outcome(r)
        target = m.target if m.target and "://" not in m.target else destination
        span = tracer.start_span(
            "outrelay.send",
            context=parent,
            kind=SpanKind.PRODUCER,
            links=to_claim,
            start_time=send0,
            attributes={
                "messaging.system": system,
                "messaging.destination.name": target,
                "messaging.operation.type": "send",
                "cloudevents.event_id": m.event.id,
                "cloudevents.event_type": m.event.type,
                "outrelay.destination": destination,
                "outrelay.attempt": m.attempt,
                "outrelay.outcome": outcome,
            },
        )
        if error is not None:
            span.set_status(Status(StatusCode.ERROR, error))
        span.end(end_time=send1)
    tracer.start_span("outrelay.settle", links=links, attributes=batch, start_time=send1).end(end_time=settled)
