"""Event logs: one structured line per published event, on ``outrelay.events``.

Every event a destination's broker confirmed (:class:`~outrelay.core.contract.transport.Delivered`,
duplicates included) gives one INFO record on the logger ``outrelay.events``
with these fields (the seed's names)::

    eventId      the event id
    workflowId   label ``workflowId``, else metadata ``workflowId``, else null
    executionId  label ``executionId``, else metadata ``executionId``, else the stream
                 (a stream is the ordering key: one workflow execution)
    tenantId     the tenant, or null
    eventType    the type
    producer     the source
    timestamp    the event's time (RFC 3339, UTC; set when the event was created)
    destination  where it was published

With ``outrelay run --log-format json`` each event is one line holding one
JSON object with those keys (and ``ts``, ``level``, ``logger``, ``msg`` =
``"published"``); in text mode each event is one line
``<time> INFO outrelay.events: published eventId=... workflowId=... ...``.
Failed sends are not event logs: the relay logs outages itself.

Cost: the plugin observes ``outrelay_batch_settled`` (once per batch) and
returns at once unless ``outrelay.events`` is enabled for INFO — the library
default, where nothing configured logging, is WARNING, so embedding
applications pay nothing; ``outrelay run`` logs at INFO. A batch's events
travel in **one** log record (an :class:`EventLines` message) that outrelay's
formatters (:mod:`outrelay.cli._jsonlog`) write as one line per event: the
per-record cost of :mod:`logging` (record, handler lock, flush) is paid once
per batch, and each line is built only when a handler formats it. A plain
:class:`logging.Formatter` of your own prints the record as one entry of
several lines, the first prefixed.

Configuration (``[event_log]`` in the config file, see
:class:`EventLogConfig`, a section this plugin registers): ``enabled = false`` turns the
plugin off; ``sample = 0.1`` logs the events whose id hashes (CRC-32) under
10% of the range — deterministic, so a sampled event is logged by every relay
and every retry alike. Raising the logger's level (``outrelay.events`` to
WARNING) turns the lines off too.

The module is a default plugin: on ``outrelay_relay_started`` it registers one
:class:`EventLog` per relay (on the relay's plugin manager, for the relay's
destinations) and removes it on ``outrelay_relay_stopped``.
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field

from outrelay.core.config.hookspecs import ConfigView, hookimpl
from outrelay.core.contract.transport import Delivered, Message, SendResult
from outrelay.core.model.envelope import Event

__all__ = ["LOGGER_NAME", "EventLines", "EventLog", "EventLogConfig", "event_fields", "event_log_config", "sampled"]

#: the logger every event log line goes to
LOGGER_NAME = "outrelay.events"


class EventLogConfig(BaseModel):
    """The ``[event_log]`` table: one log line per published event on the
    ``outrelay.events`` logger (see :mod:`outrelay.plugins.eventlog`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    enabled: bool = Field(True, description="log every published event (the logger must also be enabled for INFO)")
    sample: float = Field(
        1.0,
        ge=0.0,
        le=1.0,
        description="fraction of events logged, chosen by a hash of the event id (deterministic: an event is "
        "logged by every relay and every retry alike); 1 logs all, 0 none",
    )


def event_log_config(config: ConfigView) -> EventLogConfig:
    """The ``[event_log]`` section of ``config`` (the defaults, logging on, when the file has none)."""
    return config.section("event_log", EventLogConfig) or EventLogConfig()


@hookimpl
def outrelay_config_sections() -> dict[str, type[BaseModel]]:
    """This plugin owns ``[event_log]``."""
    return {"event_log": EventLogConfig}


def event_fields(event: Event, destination: str) -> dict[str, str | None]:
    """The event log fields of ``event`` published to ``destination`` (see the module docstring)."""
    labels, meta = event.labels, event.metadata
    return {
        "eventId": event.id,
        "workflowId": labels.get("workflowId") or meta.get("workflowId"),
        "executionId": labels.get("executionId") or meta.get("executionId") or event.stream,
        "tenantId": event.tenant,
        "eventType": event.type,
        "producer": event.source,
        "timestamp": event.time_text,
        "destination": destination,
    }


class EventLines:
    """The message of one event log record: the published events of one batch.

    :meth:`records` gives one field dict per event (the JSON formatter writes
    each as a line, with :attr:`title` as ``msg``), :meth:`lines` one text
    line per event (the text formatter prefixes each); ``str()`` joins the
    text lines for any other formatter.
    """

    __slots__ = ("destination", "events")

    title = "published"

    def __init__(self, events: Sequence[Event], destination: str) -> None:
        self.events = events
        self.destination = destination

    def records(self) -> Iterator[dict[str, str | None]]:
        d = self.destination
        return (event_fields(e, d) for e in self.events)

    def lines(self) -> list[str]:
        title = self.title
        return [" ".join([title, *(f"{k}={_text(v)}" for k, v in r.items())]) for r in self.records()]

    def __str__(self) -> str:
        return "\n".join(self.lines())

    def __repr__(self) -> str:
        return f"<EventLines {len(self.events)} event(s) -> {self.destination}>"


#: a value needing quotes in ``key=value`` text: empty, or anything but printable ASCII without space, '"', '=', '\\'
_UNSAFE = re.compile(r"[^!#-<>-\[\]-~]|^$")


def _text(value: str | None) -> str:
    """``-`` for none; JSON-quoted when the value would break ``key=value`` parsing."""
    if value is None:
        return "-"
    return orjson.dumps(value).decode() if _UNSAFE.search(value) else value


def _threshold(sample: float) -> int | None:
    """CRC-32 values below this are logged (None: all)."""
    return None if sample >= 1.0 else int(sample * 2**32)


def sampled(event_id: str, sample: float) -> bool:
    """Whether an event with ``event_id`` is logged at sampling rate ``sample``."""
    limit = _threshold(sample)
    return limit is None or zlib.crc32(event_id.encode()) < limit


class EventLog:
    """The hook implementation: logs the published events of each settled batch.

    ``destinations`` limits it to those destinations (a relay's own, when
    several relays share one plugin manager); ``None`` logs all.
    """

    def __init__(
        self,
        *,
        sample: float = 1.0,
        destinations: Collection[str] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        if not 0.0 <= sample <= 1.0:
            raise ValueError(f"event log sample must be between 0 and 1, got {sample}")
        self.sample = sample
        self.destinations = frozenset(destinations) if destinations is not None else None
        self.logger = logger or logging.getLogger(LOGGER_NAME)
        self._limit = _threshold(sample)

    @hookimpl
    def outrelay_batch_settled(
        self, destination: str, messages: Sequence[Message], results: Sequence[SendResult], elapsed: float
    ) -> None:
        logger = self.logger
        if not logger.isEnabledFor(logging.INFO):
            return
        if self.destinations is not None and destination not in self.destinations:
            return
        limit, crc32 = self._limit, zlib.crc32
        events = [
            m.event
            for m, r in zip(messages, results, strict=True)
            if isinstance(r, Delivered) and (limit is None or crc32(m.event.id.encode()) < limit)
        ]
        if events:
            # makeRecord + handle: the record logger.info() would make, without its stack walk
            logger.handle(
                logger.makeRecord(logger.name, logging.INFO, __file__, 0, EventLines(events, destination), (), None)
            )


def _plugin_name(relay: Any) -> str:
    return f"{LOGGER_NAME}:{id(relay)}"


@hookimpl
def outrelay_relay_started(relay: Any) -> None:
    """Register an :class:`EventLog` for ``relay`` as its ``[event_log]`` config says."""
    cfg = event_log_config(relay.config)
    pm = relay.registry.pm
    if not cfg.enabled or cfg.sample <= 0 or pm.get_plugin(_plugin_name(relay)) is not None:
        return
    pm.register(EventLog(sample=cfg.sample, destinations=list(relay.transports)), name=_plugin_name(relay))


@hookimpl
def outrelay_relay_stopped(relay: Any) -> None:
    """Remove the relay's :class:`EventLog`."""
    pm = relay.registry.pm
    plugin = pm.get_plugin(_plugin_name(relay))
    if plugin is not None:
        pm.unregister(plugin)
