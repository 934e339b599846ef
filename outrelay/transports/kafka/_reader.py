"""Consumer side of the ``kafka`` transport (an aiokafka consumer group).

With ``group_id`` the reader joins that consumer group (offsets auto-committed,
partitions shared with the group's other members), waits for its assignment
and resumes from the group's committed offsets (a new group starts at the
end); without one it assigns itself every partition of the topic (no group
coordination, which takes seconds on some brokers) from their end. Either
way positions are resolved before ``start`` returns, so nothing published
afterwards is missed; ``from_beginning=True`` starts at the beginning. Each
record is decoded back to the original Event from the ``ce_*`` headers or
the structured JSON value.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from outrelay.kit import (
    Reader,
    Received,
    RetryableError,
    attribute_names,
    from_attributes,
    from_structured,
    is_structured,
)
from outrelay.transports.kafka._config import KafkaConfig
from outrelay.transports.kafka._errors import map_kafka_errors

__all__ = ["KafkaReader", "decode"]


def decode(topic: str, key: bytes | None, value: bytes | None, headers: Any) -> Received:
    """Rebuild a :class:`Received` from a raw record (binary or structured mode).

    ``headers`` of the result holds every record header (values decoded as
    UTF-8, invalid bytes replaced), ``body`` the raw value.

    :raises EventError: the record is not an outrelay CloudEvent.
    :raises UnicodeDecodeError: the record key is not UTF-8.
    """
    known = _KNOWN
    hdrs: dict[str, str] = {}
    attrs: dict[str, str] = {}
    for k, v in headers or ():  # one pass: values decoded, attributes collected
        try:
            text = v.decode() if v else ""  # strict UTF-8 (the fast call); where it fails, what "replace" gives
        except UnicodeDecodeError:
            text = v.decode("utf-8", "replace")
        hdrs[k] = text
        attr = known.get(k)
        if attr is not None:
            attrs[attr] = text
        # another spelling, or an extension outrelay does not write; k[2:3] first: no other character
        # lower-cases to "_", so it only spares content-type and the like a slice and a lower()
        elif k[2:3] == "_" and k[:3].lower() == "ce_":
            attrs[k[3:].lower()] = text
    body = value or b""
    ctype = hdrs.get("content-type")
    if is_structured(ctype):
        event = from_structured(body)
    else:
        if ctype and "datacontenttype" not in attrs:
            attrs["datacontenttype"] = ctype
        event = from_attributes(attrs, body)  # what from_binary(hdrs, prefix="ce_") does
    # Received(event, topic, key, hdrs, body, ctype), its slots filled directly: a frozen dataclass's
    # __init__ goes through object.__setattr__ per field, which costs as much again, once per record
    received = _new(Received)
    _PUT_EVENT(received, event)
    _PUT_TARGET(received, topic)
    _PUT_KEY(received, key.decode() if key is not None else None)
    _PUT_HEADERS(received, hdrs)
    _PUT_BODY(received, body)
    _PUT_CTYPE(received, ctype)
    return received


_KNOWN = attribute_names("ce_")
_new = object.__new__
_RECEIVED_FIELDS = ("event", "target", "key", "headers", "body", "content_type")
if tuple(f.name for f in dataclasses.fields(Received)) != _RECEIVED_FIELDS:  # pragma: no cover - a changed Received
    raise ImportError(f"kafka decode fills Received's fields {_RECEIVED_FIELDS}; Received changed: update decode")
_PUT_EVENT, _PUT_TARGET, _PUT_KEY, _PUT_HEADERS, _PUT_BODY, _PUT_CTYPE = (
    Received.__dict__[name].__set__ for name in _RECEIVED_FIELDS
)


class KafkaReader(Reader):
    """See the module docstring."""

    def __init__(
        self, cfg: KafkaConfig, topic: str, *, group_id: str | None = None, from_beginning: bool = False
    ) -> None:
        self.cfg = cfg
        self.topic = topic
        self.group_id = group_id
        self.from_beginning = from_beginning
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        from outrelay.transports.kafka._transport import client_options

        where = f"reader of {self.topic}"
        with map_kafka_errors(f"subscribe to {self.topic!r}", where):
            topics = (self.topic,) if self.group_id else ()
            consumer = AIOKafkaConsumer(
                *topics,
                **client_options(self.cfg),
                group_id=self.group_id,
                auto_offset_reset="earliest" if self.from_beginning else "latest",
                enable_auto_commit=self.group_id is not None,
            )
            try:
                # joining a group may wait out a departed member's session (10 s by default)
                await asyncio.wait_for(consumer.start(), self.cfg.connect_timeout + (15 if self.group_id else 0))
                if not self.group_id:
                    # the producer's metadata wait (public there as partitions_for): it also auto-creates
                    parts = await asyncio.wait_for(
                        consumer._client._wait_on_metadata(self.topic), self.cfg.connect_timeout
                    )
                    consumer.assign([TopicPartition(self.topic, p) for p in sorted(parts)])
                loop = asyncio.get_running_loop()
                deadline = loop.time() + self.cfg.connect_timeout
                while not consumer.assignment():
                    if loop.time() > deadline:
                        raise RetryableError(f"kafka consumer group got no partitions of {self.topic!r}")
                    await asyncio.sleep(0.02)
                assigned = list(consumer.assignment())
                if self.from_beginning:
                    await consumer.seek_to_beginning(*assigned)
                elif not self.group_id:
                    await consumer.seek_to_end(*assigned)
                # resolve positions now (a group's committed offsets, else the reset policy), not at the first read
                for tp in assigned:
                    await consumer.position(tp)
            except BaseException:
                await consumer.stop()
                raise
        self._consumer = consumer

    async def read(self, count: int, timeout: float) -> list[Received]:
        consumer = self._consumer
        if consumer is None:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        with map_kafka_errors(f"read {self.topic!r}", f"reader of {self.topic}"):
            while len(out) < count:
                left = deadline - loop.time()
                if left <= 0:
                    break
                batches = await consumer.getmany(timeout_ms=int(min(left, 0.5) * 1000), max_records=count - len(out))
                for records in batches.values():
                    for r in records:
                        out.append(decode(r.topic, r.key, r.value, r.headers))
        return out

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            await consumer.stop()
