"""The ``sqs`` transport: Amazon SQS standard and FIFO queues through boto3.

Each event is one message whose body is the structured CloudEvent
(``application/cloudevents+json``; SQS carries at most 10 attributes, so
the envelope travels in the body) plus the filter attributes of
:func:`~outrelay.transports.aws._wire.message_attributes`. ``queue_url`` may be a
template (``https://sqs.../123/{category}.fifo``).

FIFO queues (URL ending in ``.fifo``, or ``fifo = true``): ``MessageGroupId``
= the stream, ``MessageDeduplicationId`` = the event id (both hashed with
SHA-256 when they are not valid SQS ids), so SQS orders per stream and
drops re-sends within its 5-minute window. A failed entry does not stop
later entries of its group in the same ``SendMessageBatch``, so the
transport declares ``ordered_batches = False`` and the relay sends at most
one message per stream per batch. Standard queues neither order nor dedupe.

``delay_seconds`` (0-900) delays delivery; SQS allows it only on standard
queues (FIFO queues take a queue-level delay). Batches are split into
requests of at most 10 entries and ``message_limit`` bytes, each entry's
outcome reported as its request answers (:mod:`outrelay.transports.aws._batch`);
see :mod:`outrelay.transports.aws._client` for threading and
:mod:`outrelay.transports.aws._errors` for error mapping (credentials
refused, e.g. without ``sqs:SendMessage``, reject every message of the
request, saying what to fix, and disable the destination: its events stay
pending until ``outrelay enable``) and :mod:`outrelay.transports.aws._transport`
for ``check()``'s empty ``SendMessageBatch`` permission probe.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field, model_validator

from outrelay.kit import Message, Reader

from ._client import AWSClient
from ._config import AWSConfig
from ._reader import SQSReader
from ._transport import AWSTransport
from ._wire import message_attributes

__all__ = ["SQSConfig", "SQSTransport"]


class SQSConfig(AWSConfig):
    """``queue_url`` (template) and ``delay_seconds``; AWS options in :class:`AWSConfig`."""

    queue_url: str
    delay_seconds: int = Field(0, ge=0, le=900)

    @model_validator(mode="after")
    def _fifo_delay(self) -> SQSConfig:
        if self.is_fifo(self.queue_url) and self.delay_seconds:
            raise ValueError("delay_seconds is not allowed on FIFO queues (set DelaySeconds on the queue instead)")
        return self


class SQSTransport(AWSTransport[SQSConfig]):
    """See the module docstring."""

    name = "sqs"
    Config = SQSConfig
    target_option = "queue_url"
    entity = "queue"
    batch_call = "SendMessageBatch"
    entries_param = "Entries"
    target_param = "QueueUrl"
    probe_call = "GetQueueAttributes"
    probe_args: ClassVar[dict[str, Any]] = {"AttributeNames": ["FifoQueue", "QueueArn"]}

    def _entry(self, m: Message, body: str) -> dict[str, Any]:
        fields: dict[str, Any] = {"MessageBody": body, "MessageAttributes": message_attributes(m.event)}
        if self.cfg.delay_seconds:
            fields["DelaySeconds"] = self.cfg.delay_seconds
        return fields

    def _describe(self, target: str, attrs: dict[str, str]) -> str:
        kind = "FIFO" if attrs.get("FifoQueue") == "true" else "standard"
        return f"sqs {kind} queue {attrs.get('QueueArn', target)} reachable"

    def reader(self, target: str, **options: Any) -> Reader:
        """An :class:`~._reader.SQSReader` of queue ``target`` with its own client (``delete=False`` keeps
        what it reads in the queue)."""
        return SQSReader(AWSClient("sqs", self.cfg, self.destination), target, **options)
