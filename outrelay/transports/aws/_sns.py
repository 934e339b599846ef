"""The ``sns`` transport: Amazon SNS standard and FIFO topics through boto3.

Each event is one ``PublishBatch`` entry whose message is the structured
CloudEvent (JSON) plus the filter attributes ``type`` and ``tenant`` (see
:func:`~outrelay.transports.aws._wire.message_attributes`)
for subscription filter policies. ``topic_arn`` may be a template.

FIFO topics (ARN ending in ``.fifo``, or ``fifo = true``):
``MessageGroupId`` = the stream, ``MessageDeduplicationId`` = the event id
(SHA-256 when not a valid SNS id): SNS orders per stream towards FIFO
subscriptions and drops re-sends within 5 minutes. As with SQS, a failed
entry does not stop later entries of its group in the same batch, so
``ordered_batches = False``. Standard topics neither order nor dedupe.

Per-entry results: ``Successful`` is delivered; ``Failed`` with
``SenderFault`` is rejected (permanent) unless its code is throttling or a
destination problem; other failures are retried. Batches are split into
requests of at most 10 entries and ``message_limit`` bytes, each entry's
outcome reported as its request answers. Credentials refused (invalid, or
not allowed ``sns:Publish``) reject every message of the request, saying
what to fix, and disable the destination: its events stay pending until
``outrelay enable``. ``check()`` probes that permission with an empty
``PublishBatch`` (see :mod:`outrelay.transports.aws._transport`).

The reader creates its own SQS queue (FIFO for a FIFO topic), subscribes
it with raw message delivery and removes both when stopped.
"""

from __future__ import annotations

from typing import Any

from outrelay.kit import Message, Reader

from ._config import AWSConfig
from ._reader import SNSReader
from ._transport import AWSTransport
from ._wire import message_attributes

__all__ = ["SNSConfig", "SNSTransport"]


class SNSConfig(AWSConfig):
    """``topic_arn`` (template); AWS options in :class:`AWSConfig`."""

    topic_arn: str


class SNSTransport(AWSTransport[SNSConfig]):
    """See the module docstring."""

    name = "sns"
    Config = SNSConfig
    target_option = "topic_arn"
    entity = "topic"
    batch_call = "PublishBatch"
    entries_param = "PublishBatchRequestEntries"
    target_param = "TopicArn"
    probe_call = "GetTopicAttributes"

    def _entry(self, m: Message, body: str) -> dict[str, Any]:
        return {"Message": body, "MessageAttributes": message_attributes(m.event)}

    def _describe(self, target: str, attrs: dict[str, str]) -> str:
        kind = "FIFO" if attrs.get("FifoTopic") == "true" else "standard"
        return f"sns {kind} topic {target} reachable ({attrs.get('SubscriptionsConfirmed', '?')} subscriptions)"

    def reader(self, target: str, **options: Any) -> Reader:
        """An :class:`~._reader.SNSReader`: a temporary queue subscribed to topic ``target``."""
        return SNSReader(self.cfg, self.destination, target, fifo=self.fifo)
