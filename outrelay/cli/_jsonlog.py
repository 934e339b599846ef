"""JSON-lines log formatter carrying the event fields (eventId, stream, tenant, ...)."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import orjson

_FIELDS = ("event_id", "stream", "tenant", "event_type", "producer", "destination")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat().replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for f in _FIELDS:
            if hasattr(record, f):
                doc[f] = getattr(record, f)
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(doc).decode()


def error_json(message: str) -> str:
    """An error that ends the process, as one JSON log line (level ``error``, logger ``outrelay``)."""
    doc = {
        "ts": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
        "level": "error",
        "logger": "outrelay",
        "msg": message,
    }
    return orjson.dumps(doc).decode()
