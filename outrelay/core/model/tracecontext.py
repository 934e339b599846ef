"""W3C trace context at the outbox's two ends (the core half of ``outrelay[otel]``).

Tracing is off unless this process turns it on: ``[tracing] enabled = true``
in the config of a relay (the :mod:`outrelay.plugins.otel` plugin calls
:func:`enable` when the relay starts), ``OUTRELAY_TRACING=1`` in the
environment (checked when an :class:`~outrelay.Outbox` is created or a
subscription starts), or
:func:`outrelay.plugins.otel.enable_tracing`. While it is off, the hot paths
pay one read of the module attribute :data:`active`.

While it is on:

* **append** (:func:`stamp`): an event appended while a valid span is
  current, and that has no ``traceparent`` of its own, is stored with the
  span's context as metadata ``traceparent`` (and ``tracestate`` when there
  is one). :mod:`outrelay.core.model.cloudevents` sends both as CloudEvents
  attributes of their own (the distributed-tracing extension: ``ce-traceparent``
  over HTTP/NATS, ``ce_traceparent`` over Kafka, a top-level member in the
  structured form), so every transport and any CloudEvents consumer sees it.
* **subscribers** (:func:`consuming`): a handler of an event carrying a
  ``traceparent`` runs inside a CONSUMER span whose parent is that context,
  one span per attempt; a raising handler marks its span as an error.

The format is always W3C Trace Context, whatever propagator the process has
configured globally: it is what the CloudEvents extension defines.

:raises MissingExtraError: :func:`enable` without OpenTelemetry installed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from contextlib import AbstractContextManager
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from outrelay.core.model._draft import copier
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import MissingExtraError, UsageError

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Tracer, TracerProvider

__all__ = [
    "ENV",
    "INSTALL_HINT",
    "active",
    "consuming",
    "disable",
    "enable",
    "enable_from_env",
    "parent_context",
    "stamp",
    "tracer",
]

#: the environment switch: a true value (``1``, ``true``, ``yes``) turns tracing on
ENV = "OUTRELAY_TRACING"
#: True while tracing is on in this process (read on every append: keep it a plain attribute)
active = False

_propagator: Any = None  # TraceContextTextMapPropagator, set by enable()
_tracer: Any = None
_current_span: Any = None  # opentelemetry.trace.get_current_span, set by enable()

INSTALL_HINT = "pip install 'outrelay[otel]'"


def enable(tracer_provider: TracerProvider | None = None) -> None:
    """Turn tracing on for this process; spans go to ``tracer_provider``
    (default: OpenTelemetry's global provider, looked up when a span starts).

    :raises MissingExtraError: ``opentelemetry-api`` is not installed.
    """
    global active, _propagator, _tracer, _current_span
    try:
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        raise MissingExtraError(
            f"tracing is enabled ([tracing] enabled or ${ENV}) but OpenTelemetry is not installed: "
            f"run {INSTALL_HINT}, or turn tracing off"
        ) from None
    from outrelay._version import __version__

    _propagator = TraceContextTextMapPropagator()
    _current_span = trace.get_current_span
    _tracer = trace.get_tracer("outrelay", __version__, tracer_provider=tracer_provider)
    active = True


def disable() -> None:
    """Turn tracing off (events appended afterwards carry no new trace context)."""
    global active
    active = False


def enable_from_env() -> None:
    """:func:`enable` when ``$OUTRELAY_TRACING`` is true and tracing is not on yet.

    :raises MissingExtraError: it is set and OpenTelemetry is not installed.
    """
    if not active and os.environ.get(ENV, "").strip().lower() in ("1", "true", "yes", "on"):
        enable()


def tracer() -> Tracer:
    """outrelay's tracer. :raises UsageError: tracing was never enabled."""
    if _tracer is None:
        raise UsageError("tracing is not enabled: call outrelay.plugins.otel.enable_tracing() first")
    return _tracer  # type: ignore[no-any-return]


def stamp(events: list[Event]) -> list[Event]:
    """``events`` with the current span's context added to the metadata of
    those without a ``traceparent``; unchanged when no valid span is current."""
    carrier: dict[str, str] = {}
    _propagator.inject(carrier)
    if "traceparent" not in carrier:
        return events
    return [e if "traceparent" in e.metadata else _with_metadata(e, carrier) for e in events]


# a copy through the slot descriptors, without re-validation (Event.replace re-checks and re-encodes
# every field: several times the cost); the added values come from the W3C propagator, which only
# emits valid header text
_COPY_WITH_METADATA = copier(Event, "metadata")


def _with_metadata(event: Event, extra: dict[str, str]) -> Event:
    return _COPY_WITH_METADATA(event, MappingProxyType({**event.metadata, **extra}))  # type: ignore[no-any-return]


def parent_context(metadata: Mapping[str, str]) -> Context | None:
    """The remote context ``metadata``'s ``traceparent``/``tracestate`` name,
    or None when there is none or it is malformed."""
    if "traceparent" not in metadata:
        return None
    ctx = _propagator.extract(metadata)
    return ctx if _current_span(ctx).get_span_context().is_valid else None


def consuming(event: Event, consumer: str) -> AbstractContextManager[Any]:
    """A current CONSUMER span ``outrelay.process`` for one handler attempt on
    ``event``, child of the event's trace context (a new trace without one)."""
    from opentelemetry.trace import SpanKind

    return tracer().start_as_current_span(
        "outrelay.process",
        context=parent_context(event.metadata),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "outrelay",
            "messaging.operation.type": "process",
            "messaging.consumer.group.name": consumer,
            "cloudevents.event_id": event.id,
            "cloudevents.event_type": event.type,
            "cloudevents.event_source": event.source,
        },
    )
