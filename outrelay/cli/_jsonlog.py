"""Log formatters of ``outrelay run``: JSON lines carrying the event fields, and text.

A record whose message has ``records()`` (the event log's
:class:`~outrelay.plugins.eventlog.EventLines`: one batch's published events)
is written as one line per event by both formatters.
"""

from __future__ import annotations

import copy
import logging
from datetime import UTC, datetime

import orjson

#: structured fields a log call passes in `extra=`, written as top-level members of its JSON line
_FIELDS = (
    "destination",
    "event_id",
    "stream",
    "tenant",
    "event_type",
    "producer",
    "error",
    "reason",
    "attempts",
    "signal",
)


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        records = getattr(record.msg, "records", None)
        if records is not None:  # event log lines: one JSON object per event, its fields at the top level
            doc["msg"] = record.msg.title
            return b"\n".join([orjson.dumps(doc | r) for r in records()]).decode()
        doc["msg"] = record.getMessage()
        for f in _FIELDS:
            if hasattr(record, f):
                doc[f] = getattr(record, f)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


class TextFormatter(logging.Formatter):
    """The text formatter; event log records become one prefixed line per event."""

    def format(self, record: logging.LogRecord) -> str:
        lines = getattr(record.msg, "lines", None)
        if lines is None:
            return super().format(record)
        head = copy.copy(record)
        head.msg, head.args = "", ()
        prefix = super().format(head)
        return "\n".join([prefix + line for line in lines()])


def error_json(message: str) -> str:
    """An error that ends the process, as one JSON log line (level ``error``, logger ``outrelay``)."""
    doc = {
        "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "level": "error",
        "logger": "outrelay",
        "msg": message,
    }
    return orjson.dumps(doc).decode()
