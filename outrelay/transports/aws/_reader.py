"""Reading back what ``sqs`` and ``sns`` published.

:class:`SQSReader` receives (and deletes) messages from one queue, decoding
the structured CloudEvent body (:func:`._wire.decode`). :class:`SNSReader`
creates its own SQS queue (FIFO for a FIFO topic), allows the topic to send
to it, subscribes it with raw message delivery, reads through an
:class:`SQSReader` and removes subscription and queue when stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import uuid

from outrelay.kit import Reader, Received, TransportError

from ._client import AWSClient
from ._config import AWSConfig
from ._wire import decode

__all__ = ["SNSReader", "SQSReader"]


class SQSReader(Reader):
    """Receives (and, with ``delete``, deletes) messages from one queue. It sees
    what is in the queue, including messages sent before :meth:`start` (SQS
    cannot skip them): give it a fresh queue."""

    def __init__(self, aws: AWSClient, queue_url: str, *, delete: bool = True) -> None:
        self.aws = aws
        self.queue_url = queue_url
        self.delete = delete

    async def start(self) -> None:
        await self.aws.start()

    async def read(self, count: int, timeout: float) -> list[Received]:
        """Up to ``count`` messages within ``timeout`` seconds (long polls of at most 1 s).

        :raises TransportError: a receive or delete failed. :raises EventError: a foreign message.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        while len(out) < count and (left := deadline - loop.time()) > 0:
            msgs = await self._receive(min(10, count - len(out)), max(0, min(1, int(left))))
            out.extend(decode(m, self.queue_url) for m in msgs)
            if not msgs and left < 1:
                await asyncio.sleep(min(0.05, max(0.0, deadline - loop.time())))
        return out

    async def _receive(self, n: int, wait: int) -> list[dict[str, object]]:
        resp = await self.aws.call(
            f"sqs ReceiveMessage {self.queue_url}",
            self.aws.client.receive_message,
            QueueUrl=self.queue_url,
            MaxNumberOfMessages=n,
            WaitTimeSeconds=wait,
            MessageAttributeNames=["All"],
            MessageSystemAttributeNames=["All"],
        )
        msgs: list[dict[str, object]] = resp.get("Messages", [])
        if msgs and self.delete:
            await self.aws.call(
                f"sqs DeleteMessageBatch {self.queue_url}",
                self.aws.client.delete_message_batch,
                QueueUrl=self.queue_url,
                Entries=[{"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]} for i, m in enumerate(msgs)],
            )
        return msgs

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await self.aws.stop()


def _allow_topic(queue_arn: str, topic_arn: str) -> str:
    """The queue policy real SQS needs before it accepts the topic's deliveries."""
    statement = {
        "Effect": "Allow",
        "Principal": {"Service": "sns.amazonaws.com"},
        "Action": "sqs:SendMessage",
        "Resource": queue_arn,
        "Condition": {"ArnEquals": {"aws:SourceArn": topic_arn}},
    }
    return json.dumps({"Version": "2012-10-17", "Statement": [statement]})


class SNSReader(Reader):
    """A temporary SQS queue subscribed to the topic with raw delivery (see the module docstring)."""

    def __init__(self, cfg: AWSConfig, destination: str, topic_arn: str, *, fifo: bool) -> None:
        self.topic_arn = topic_arn
        self.fifo = fifo
        self.sns = AWSClient("sns", cfg, destination)
        self.sqs = AWSClient("sqs", cfg, destination)
        self.queue_url: str | None = None
        self.subscription: str | None = None
        self.inner: SQSReader | None = None

    async def start(self) -> None:
        """:raises TransportError: the queue or the subscription could not be made."""
        await self.sns.start()
        await self.sqs.start()
        sqs = self.sqs.client
        name = f"outrelay-reader-{uuid.uuid4().hex[:12]}" + (".fifo" if self.fifo else "")
        attrs = {"FifoQueue": "true"} if self.fifo else {}
        q = await self.sqs.call("sqs CreateQueue", sqs.create_queue, QueueName=name, Attributes=attrs)
        self.queue_url = url = str(q["QueueUrl"])
        got = await self.sqs.call(
            "sqs GetQueueAttributes", sqs.get_queue_attributes, QueueUrl=url, AttributeNames=["QueueArn"]
        )
        queue_arn = got["Attributes"]["QueueArn"]
        policy = {"Policy": _allow_topic(queue_arn, self.topic_arn)}
        await self.sqs.call("sqs SetQueueAttributes", sqs.set_queue_attributes, QueueUrl=url, Attributes=policy)
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
        self.inner = SQSReader(self.sqs, url)

    async def read(self, count: int, timeout: float) -> list[Received]:
        if self.inner is None:
            raise TransportError("sns reader is not started")
        got = await self.inner.read(count, timeout)
        return [dataclasses.replace(r, target=self.topic_arn) for r in got]

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            if self.subscription:
                await self.sns.call("sns Unsubscribe", self.sns.client.unsubscribe, SubscriptionArn=self.subscription)
        with contextlib.suppress(Exception):
            if self.queue_url:
                await self.sqs.call("sqs DeleteQueue", self.sqs.client.delete_queue, QueueUrl=self.queue_url)
        self.subscription = self.queue_url = None
        self.inner = None
        await self.sns.stop()
        await self.sqs.stop()
