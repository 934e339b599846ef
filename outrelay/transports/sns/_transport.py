"""The ``sns`` transport: Amazon SNS standard and FIFO topics through boto3.

Each event is one ``PublishBatch`` entry whose message is the structured
CloudEvent (JSON) plus the filter attributes ``type`` and ``tenant`` (see
:func:`~outrelay.transports._aws.message_attributes`)
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
requests of at most 10 entries and ``message_limit`` bytes. Credentials
refused (invalid, or not allowed ``sns:Publish``) reject every message of
the request, saying what to fix, and disable the destination: its events
stay pending until ``outrelay enable``. ``check()`` probes that permission
with an empty ``PublishBatch`` (see :mod:`outrelay.transports._aws_transport`).

The reader creates its own SQS queue (FIFO for a FIFO topic), subscribes
it with raw message delivery and removes both when stopped.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import Any

from outrelay.kit import Message, Reader, Received, TransportError
from outrelay.transports._aws import AWSBase, AWSConfig, message_attributes
from outrelay.transports._aws_transport import AWSTransport
from outrelay.transports.sqs._transport import SQSReader

__all__ = ["SNSConfig", "SNSReader", "SNSTransport"]


class SNSConfig(AWSConfig):
    """``topic_arn`` (template); AWS options in :class:`AWSConfig`."""

    topic_arn: str


class SNSTransport(AWSTransport):
    """See the module docstring."""

    name = "sns"
    Config = SNSConfig
    target_option = "topic_arn"
    entity = "topic"
    batch_call = "PublishBatch"

    def __init__(self, config: SNSConfig, *, destination: str = "sns") -> None:
        super().__init__(config, destination=destination)
        self.cfg: SNSConfig = config

    async def _probe(self, arn: str) -> dict[str, str]:
        resp = await self.aws.call(f"sns GetTopicAttributes {arn}", self.aws.client.get_topic_attributes, TopicArn=arn)
        attrs: dict[str, str] = resp.get("Attributes", {})
        return attrs

    def _entry(self, m: Message, body: str) -> dict[str, Any]:
        return {"Message": body, "MessageAttributes": message_attributes(m.event)}

    async def _api(self, target: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        resp: dict[str, Any] = await self.aws.call(
            f"sns PublishBatch {target}",
            self.aws.client.publish_batch,
            TopicArn=target,
            PublishBatchRequestEntries=entries,
        )
        return resp

    def _describe(self, target: str, attrs: dict[str, str]) -> str:
        kind = "FIFO" if attrs.get("FifoTopic") == "true" else "standard"
        return f"sns {kind} topic {target} reachable ({attrs.get('SubscriptionsConfirmed', '?')} subscriptions)"

    def reader(self, target: str, **options: Any) -> Reader:
        return SNSReader(self.cfg, self.destination, target, fifo=self.fifo)


class SNSReader(Reader):
    """A temporary SQS queue subscribed to the topic with raw delivery."""

    def __init__(self, cfg: AWSConfig, destination: str, topic_arn: str, *, fifo: bool) -> None:
        self.topic_arn = topic_arn
        self.fifo = fifo
        self.sns = AWSBase("sns", cfg, destination)
        self.sqs = AWSBase("sqs", cfg, destination)
        self.queue_url: str | None = None
        self.subscription: str | None = None
        self.inner: SQSReader | None = None

    async def start(self) -> None:
        await self.sns.start()
        await self.sqs.start()
        name = f"outrelay-reader-{uuid.uuid4().hex[:12]}" + (".fifo" if self.fifo else "")
        attrs = {"FifoQueue": "true"} if self.fifo else {}
        q = await self.sqs.call("sqs CreateQueue", self.sqs.client.create_queue, QueueName=name, Attributes=attrs)
        self.queue_url = str(q["QueueUrl"])
        got = await self.sqs.call(
            "sqs GetQueueAttributes",
            self.sqs.client.get_queue_attributes,
            QueueUrl=self.queue_url,
            AttributeNames=["QueueArn"],
        )
        queue_arn = got["Attributes"]["QueueArn"]
        # Real SQS only accepts SNS deliveries the queue policy allows.
        policy = {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": "sns.amazonaws.com"},
                    "Action": "sqs:SendMessage",
                    "Resource": queue_arn,
                    "Condition": {"ArnEquals": {"aws:SourceArn": self.topic_arn}},
                }
            ],
        }
        await self.sqs.call(
            "sqs SetQueueAttributes",
            self.sqs.client.set_queue_attributes,
            QueueUrl=self.queue_url,
            Attributes={"Policy": json.dumps(policy)},
        )
        sub = await self.sns.call(
            "sns Subscribe",
            self.sns.client.subscribe,
            TopicArn=self.topic_arn,
            Protocol="sqs",
            Endpoint=queue_arn,
            Attributes={"RawMessageDelivery": "true"},
            ReturnSubscriptionArn=True,
        )
        self.subscription = str(sub["SubscriptionArn"])
        self.inner = SQSReader(self.sqs, self.queue_url)

    async def read(self, count: int, timeout: float) -> list[Received]:
        if self.inner is None:
            raise TransportError("sns reader is not started")
        got = await self.inner.read(count, timeout)
        return [Received(r.event, self.topic_arn, r.key, r.headers, r.body, r.content_type) for r in got]

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.subscription:
                await self.sns.call("sns Unsubscribe", self.sns.client.unsubscribe, SubscriptionArn=self.subscription)
        with contextlib.suppress(Exception):
            if self.queue_url:
                await self.sqs.call("sqs DeleteQueue", self.sqs.client.delete_queue, QueueUrl=self.queue_url)
        self.subscription = self.queue_url = None
        await self.sns.stop()
        await self.sqs.stop()
