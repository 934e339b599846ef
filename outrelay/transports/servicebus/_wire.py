"""Encoding of the ``servicebus`` transport (the CloudEvents AMQP binding, binary mode).

* data <-> the message body (one Data section, bytes untouched);
* CloudEvents attributes <-> ``application_properties`` ``cloudEvents_*``;
  ``datacontenttype`` <-> ``content_type``;
* event id -> ``message_id`` (Service Bus duplicate detection keys on it);
* stream -> ``session_id`` with ``sessions`` (FIFO per stream), otherwise
  ``partition_key`` on a ``partitioned`` entity. Values over Service Bus's
  128 characters become a stable ``sha256-<hex>`` (:func:`broker_id`).
"""

from __future__ import annotations

import hashlib
from typing import Any

from azure.servicebus import ServiceBusMessage

from outrelay.kit import Message, Received, binary_headers, from_binary
from outrelay.transports.servicebus._config import ServiceBusConfig

__all__ = ["MAX_ID_LENGTH", "PREFIX", "broker_id", "decode", "encode"]

PREFIX = "cloudEvents_"
#: Service Bus caps MessageId and SessionId at 128 characters.
MAX_ID_LENGTH = 128


def broker_id(value: str) -> str:
    """``value`` as a MessageId/SessionId: itself, or when longer than 128
    characters a stable ``sha256-<hex>`` of it (same input, same id: dedupe
    and FIFO per stream still hold; the full value stays in ``cloudEvents_*``)."""
    if len(value) <= MAX_ID_LENGTH:
        return value
    return "sha256-" + hashlib.sha256(value.encode()).hexdigest()


def encode(m: Message, cfg: ServiceBusConfig) -> ServiceBusMessage:
    """``m`` as a ``ServiceBusMessage``. :raises ValueError/TypeError: the SDK refused a field."""
    ev = m.event
    return ServiceBusMessage(
        ev.data,
        message_id=broker_id(ev.id),
        session_id=broker_id(m.key) if cfg.sessions else None,
        partition_key=broker_id(m.key) if cfg.partitioned and not cfg.sessions else None,
        content_type=ev.content_type,
        application_properties=binary_headers(ev, prefix=PREFIX),  # type: ignore[arg-type]
    )


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def decode(msg: Any, entity: str) -> Received:
    """A received message of ``entity`` as :class:`Received` (key: the stream it was sent under).

    :raises outrelay.EventError: the properties do not make a CloudEvent.
    """
    props = {_text(k): _text(v) for k, v in (msg.application_properties or {}).items()}
    body = b"".join(msg.body)
    ctype = msg.content_type
    event = from_binary(props, body, content_type=ctype, prefix=PREFIX)
    headers = dict(props)
    if msg.message_id is not None:
        headers["message_id"] = str(msg.message_id)
    key = msg.session_id
    if key is not None and key == broker_id(event.stream):
        key = event.stream  # a long stream travels hashed: report the stream it stands for
    return Received(event, entity, key, headers, body, ctype)
