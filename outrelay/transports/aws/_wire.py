"""A message on the wire: the structured CloudEvent body, the filter attributes, the FIFO ids.

Each event is one message whose body is the structured CloudEvent
(``application/cloudevents+json``; SQS carries at most 10 attributes, so the
envelope travels in the body) plus the attributes ``type`` and, when set,
``tenant`` that subscription filter policies need. These names deliberately
avoid the ``ce-`` prefix, which would make CloudEvents SDKs read the message
as binary mode.
"""

from __future__ import annotations

import hashlib
import re
from typing import Any

from outrelay.kit import STRUCTURED_CONTENT_TYPE, Event, Received, from_structured, to_structured

__all__ = ["decode", "encoded_size", "fifo_id", "message_attributes", "structured_body"]

# Amazon's rule for MessageGroupId / MessageDeduplicationId: 1-128 alphanumeric or punctuation characters.
_FIFO_ID_RE = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")


def fifo_id(value: str) -> str:
    """``value`` if it is a valid MessageGroupId/MessageDeduplicationId, else its SHA-256 (stable)."""
    if _FIFO_ID_RE.match(value):
        return value
    return hashlib.sha256(value.encode()).hexdigest()


def message_attributes(event: Event) -> dict[str, dict[str, str]]:
    """The filter attributes ``type`` and, when set, ``tenant`` (see the module docstring)."""
    out = {"type": event.type}
    if event.tenant:
        out["tenant"] = event.tenant
    return {k: {"DataType": "String", "StringValue": v} for k, v in out.items()}


def encoded_size(body: str, attrs: dict[str, dict[str, str]]) -> int:
    """Bytes the service counts: body plus attribute names, types and values."""
    attr_bytes = sum(len(k) + len(v["DataType"]) + len(v["StringValue"].encode()) for k, v in attrs.items())
    return len(body.encode()) + attr_bytes


def structured_body(event: Event) -> str:
    """The structured-mode CloudEvent (JSON) of ``event``."""
    return to_structured(event).decode()


def decode(msg: dict[str, Any], target: str) -> Received:
    """One SQS ``ReceiveMessage`` message as read back from ``target``.

    The key is the stream: the FIFO group id is the stream, or its SHA-256
    when the stream is not a valid SQS id (then the stream is given back);
    another group id is given as is. :raises EventError: the body is not an
    outrelay structured CloudEvent.
    """
    body = str(msg.get("Body", ""))
    headers = {k: str(v.get("StringValue", "")) for k, v in msg.get("MessageAttributes", {}).items()}
    event = from_structured(body)
    group = msg.get("Attributes", {}).get("MessageGroupId")
    key = event.stream if group is None or group == fifo_id(event.stream) else group
    return Received(event, target, key, headers, body.encode(), STRUCTURED_CONTENT_TYPE)
