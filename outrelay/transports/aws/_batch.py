"""Batch sending shared by ``sns`` (PublishBatch) and ``sqs`` (SendMessageBatch).

:func:`send_batch` is a whole ``send()``: each message is size-checked on its
data (over ``max_message_bytes``: Rejected) and on its encoded form (body +
attributes over ``message_limit``: Rejected), encoded once as a structured
CloudEvent, given FIFO ids when the target is FIFO, grouped by target and
split into requests of at most 10 entries and ``message_limit`` bytes.

The requests run concurrently, at most ``max_workers`` at a time (the
client's threads). Progress: the outcome of every entry is reported to
:func:`~outrelay.kit.current_progress` as soon as its request answers, so a
send cut by the deadline or a shutdown keeps what the service confirmed. A
request waiting for a thread is started only if ``may_start`` allows it
(expecting the slowest request so far, or nothing for a request holding the
first message of a key); its entries are otherwise :func:`~outrelay.kit.deferred`.

A request refused as a whole with a permanent error is re-sent entry by
entry so one bad message cannot dead-letter its neighbours, unless the
credentials were refused (:class:`~._errors.DeniedError`: every entry would
be refused alike, so all are Rejected at once, with ``disable_destination``);
a retryable whole-request error makes its entries RetryLater.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from outrelay.kit import (
    Delivered,
    Message,
    PermanentError,
    Progress,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    current_progress,
    deferred,
)

from ._config import AWSConfig
from ._errors import DeniedError, entry_outcome
from ._wire import encoded_size, fifo_id, structured_body

__all__ = ["BatchCall", "Entry", "chunks", "prepare", "send_batch"]


@dataclasses.dataclass(slots=True)
class Entry:
    """One message ready for a batch API: its position in the batch, the
    request entry (``Id`` filled in per chunk), its counted size, and whether
    it is the first message of its key in the batch."""

    index: int
    fields: dict[str, Any]
    size: int
    first_of_key: bool = True


def chunks(entries: Sequence[Entry], limit_bytes: int, max_count: int = 10) -> list[list[Entry]]:
    """Split into requests of at most ``max_count`` entries and ``limit_bytes`` total."""
    out: list[list[Entry]] = []
    cur: list[Entry] = []
    size = 0
    for e in entries:
        if cur and (len(cur) >= max_count or size + e.size > limit_bytes):
            out.append(cur)
            cur, size = [], 0
        cur.append(e)
        size += e.size
    if cur:
        out.append(cur)
    return out


#: ``api(target, entries)``: the batch call's raw response (``Successful``/``Failed``)
BatchCall = Callable[[str, list[dict[str, Any]]], Awaitable[dict[str, Any]]]


class _Sender:
    """One send's requests: the slots, the progress and the results by batch index."""

    def __init__(self, batch: Sequence[Message], cfg: AWSConfig, api: BatchCall, what: str) -> None:
        self.batch, self.api, self.what = batch, api, what
        self.limit = cfg.message_limit
        self.progress: Progress = current_progress()
        self.slots = asyncio.Semaphore(cfg.max_workers)
        self.latency = 0.0  # the slowest request so far
        self.results: dict[int, SendResult] = {}

    def settle(self, entry: Entry, result: SendResult) -> None:
        self.results[entry.index] = result
        self.progress.report(self.batch[entry.index], result)

    async def request(self, target: str, chunk: list[Entry]) -> None:
        """Send one request (or defer it), settling each of its entries."""
        async with self.slots:
            expected = 0.0 if any(e.first_of_key for e in chunk) else self.latency
            if not self.progress.may_start(expected):
                for e in chunk:
                    self.results[e.index] = deferred(self.progress)
                return
            loop = asyncio.get_running_loop()
            began = loop.time()
            try:
                response = await self.api(target, [{**e.fields, "Id": str(i)} for i, e in enumerate(chunk)])
            except RetryableError as exc:
                for e in chunk:
                    self.settle(e, RetryLater(str(exc), exc.retry_after))
                return
            except PermanentError as exc:
                denied = isinstance(exc, DeniedError)
                if len(chunk) > 1 and not denied:
                    response = None
                else:
                    for e in chunk:
                        self.settle(e, Rejected(str(exc), disable_destination=denied))
                    return
            finally:
                self.latency = max(self.latency, loop.time() - began)
        if response is None:  # refused as a whole: entry by entry, so one bad message fails alone
            await asyncio.gather(*(self.request(target, [e]) for e in chunk))
            return
        self.answer(chunk, response)

    def answer(self, chunk: list[Entry], response: dict[str, Any]) -> None:
        for ok in response.get("Successful", ()):
            self.settle(chunk[int(ok["Id"])], Delivered())
        for bad in response.get("Failed", ()):
            code, text = str(bad.get("Code", "")), str(bad.get("Message", ""))
            outcome = entry_outcome(code, text, bool(bad.get("SenderFault")), f"{self.what} entry")
            self.settle(chunk[int(bad["Id"])], outcome)
        for e in chunk:
            if e.index not in self.results:
                self.settle(e, RetryLater("the service returned no result for this entry"))


def prepare(
    batch: Sequence[Message], cfg: AWSConfig, fifo: bool, build: Callable[[Message, str], dict[str, Any]]
) -> tuple[list[SendResult | None], dict[str, list[Entry]]]:
    """Size-check and encode ``batch``: early rejections by index, entries grouped by target.

    ``build(message, body)`` returns the service's entry fields without ``Id``.
    """
    early: list[SendResult | None] = [None] * len(batch)
    by_target: dict[str, list[Entry]] = {}
    keys: set[str] = set()
    for i, m in enumerate(batch):
        if len(m.event.data) > cfg.max_data_bytes:
            size = len(m.event.data)
            early[i] = Rejected(f"event data of {size} bytes exceeds max_message_bytes={cfg.max_data_bytes}")
            continue
        body = structured_body(m.event)
        fields = build(m, body)
        if fifo:
            fields["MessageGroupId"] = fifo_id(m.key)
            fields["MessageDeduplicationId"] = fifo_id(m.event.id)
        size = encoded_size(body, fields.get("MessageAttributes", {}))
        if size > cfg.message_limit:
            early[i] = Rejected(f"encoded CloudEvent of {size} bytes exceeds the service limit of {cfg.message_limit}")
            continue
        by_target.setdefault(m.target, []).append(Entry(i, fields, size, m.key not in keys))
        keys.add(m.key)
    return early, by_target


async def send_batch(
    batch: Sequence[Message],
    cfg: AWSConfig,
    fifo: bool,
    build: Callable[[Message, str], dict[str, Any]],
    api: BatchCall,
    what: str,
) -> list[SendResult]:
    """The whole send() (see the module docstring); one result per message, in batch order.

    ``what`` names the batch call in messages (``"sqs SendMessageBatch"``).
    """
    early, by_target = prepare(batch, cfg, fifo, build)
    sender = _Sender(batch, cfg, api, what)
    for i, r in enumerate(early):
        if r is not None:
            sender.progress.report(batch[i], r)
    requests = [sender.request(t, c) for t, es in by_target.items() for c in chunks(es, cfg.message_limit)]
    await asyncio.gather(*requests)
    return [r if r is not None else sender.results[i] for i, r in enumerate(early)]
