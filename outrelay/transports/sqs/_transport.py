"""The ``sqs`` transport: Amazon SQS standard and FIFO queues through boto3.

Each event is one message whose body is the structured CloudEvent
(``application/cloudevents+json``; SQS carries at most 10 attributes, so
the envelope travels in the body) plus the filter attributes of
:func:`~outrelay.transports._aws.message_attributes`. ``queue_url`` may be a
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
requests of at most 10 entries and ``message_limit`` bytes; see
:mod:`outrelay.transports._aws` for threading and error mapping (credentials
refused, e.g. without ``sqs:SendMessage``, reject every message of the
request, saying what to fix, and disable the destination: its events stay
pending until ``outrelay enable``) and :mod:`outrelay.transports._aws_transport`
for ``check()``'s empty ``SendMessageBatch`` permission probe.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from pydantic import Field, model_validator

from outrelay.kit import STRUCTURED_CONTENT_TYPE, Message, Reader, Received, from_structured
from outrelay.transports._aws import AWSBase, AWSConfig, fifo_id, message_attributes
from outrelay.transports._aws_transport import AWSTransport

__all__ = ["SQSConfig", "SQSReader", "SQSTransport"]


class SQSConfig(AWSConfig):
    """``queue_url`` (template) and ``delay_seconds``; AWS options in :class:`AWSConfig`."""

    queue_url: str
    delay_seconds: int = Field(0, ge=0, le=900)

    @model_validator(mode="after")
    def _fifo_delay(self) -> SQSConfig:
        fifo = self.fifo if self.fifo is not None else self.queue_url.endswith(".fifo")
        if fifo and self.delay_seconds:
            raise ValueError("delay_seconds is not allowed on FIFO queues (set DelaySeconds on the queue instead)")
        return self


class SQSTransport(AWSTransport):
    """See the module docstring."""

    name = "sqs"
    Config = SQSConfig
    target_option = "queue_url"
    entity = "queue"
    batch_call = "SendMessageBatch"

    def __init__(self, config: SQSConfig, *, destination: str = "sqs") -> None:
        super().__init__(config, destination=destination)
        self.cfg: SQSConfig = config

    async def _probe(self, url: str) -> dict[str, str]:
        resp = await self.aws.call(
            f"sqs GetQueueAttributes {url}",
            self.aws.client.get_queue_attributes,
            QueueUrl=url,
            AttributeNames=["FifoQueue", "QueueArn"],
        )
        attrs: dict[str, str] = resp.get("Attributes", {})
        return attrs

    def _entry(self, m: Message, body: str) -> dict[str, Any]:
        fields: dict[str, Any] = {"MessageBody": body, "MessageAttributes": message_attributes(m.event)}
        if self.cfg.delay_seconds:
            fields["DelaySeconds"] = self.cfg.delay_seconds
        return fields

    async def _api(self, target: str, entries: list[dict[str, Any]]) -> dict[str, Any]:
        resp: dict[str, Any] = await self.aws.call(
            f"sqs SendMessageBatch {target}", self.aws.client.send_message_batch, QueueUrl=target, Entries=entries
        )
        return resp

    def _describe(self, target: str, attrs: dict[str, str]) -> str:
        kind = "FIFO" if attrs.get("FifoQueue") == "true" else "standard"
        return f"sqs {kind} queue {attrs.get('QueueArn', target)} reachable"

    def reader(self, target: str, **options: Any) -> Reader:
        return SQSReader(AWSBase("sqs", self.cfg, self.destination), target, **options)


class SQSReader(Reader):
    """Receives (and deletes) messages from one queue, decoding the structured
    CloudEvent body. It sees what is in the queue, including messages sent
    before :meth:`start` (SQS cannot skip them): give it a fresh queue."""

    def __init__(self, aws: AWSBase, queue_url: str, *, delete: bool = True) -> None:
        self.aws = aws
        self.queue_url = queue_url
        self.delete = delete

    async def start(self) -> None:
        await self.aws.start()

    async def read(self, count: int, timeout: float) -> list[Received]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        while len(out) < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            resp = await self.aws.call(
                f"sqs ReceiveMessage {self.queue_url}",
                self.aws.client.receive_message,
                QueueUrl=self.queue_url,
                MaxNumberOfMessages=min(10, count - len(out)),
                WaitTimeSeconds=max(0, min(1, int(left))),
                MessageAttributeNames=["All"],
                MessageSystemAttributeNames=["All"],
            )
            msgs = resp.get("Messages", [])
            for msg in msgs:
                out.append(self._decode(msg))
            if msgs and self.delete:
                await self.aws.call(
                    f"sqs DeleteMessageBatch {self.queue_url}",
                    self.aws.client.delete_message_batch,
                    QueueUrl=self.queue_url,
                    Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)],
                )
            if not msgs and left < 1:
                await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))
        return out

    def _decode(self, msg: dict[str, Any]) -> Received:
        body = str(msg.get("Body", ""))
        headers = {k: str(v.get("StringValue", "")) for k, v in msg.get("MessageAttributes", {}).items()}
        event = from_structured(body)  # EventError: not an outrelay message
        group = msg.get("Attributes", {}).get("MessageGroupId")
        # The group id is the stream, or its SHA-256 when the stream is not a valid SQS id.
        key = event.stream if group is None or group == fifo_id(event.stream) else group
        return Received(event, self.queue_url, key, headers, body.encode(), STRUCTURED_CONTENT_TYPE)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.aws.stop()
