"""Batch sending shared by ``sns`` (PublishBatch) and ``sqs`` (SendMessageBatch).

:func:`send_batch` is a whole ``send()``: each message is size-checked on its
data (over ``max_message_bytes``: Rejected) and on its encoded form (body +
attributes over ``message_limit``: Rejected), encoded once as a structured
CloudEvent, given FIFO ids when the target is FIFO, grouped by target and
split into requests of at most 10 entries and ``message_limit`` bytes. The
requests run concurrently on the transport's executor; results come back in
batch order. A request refused as a whole with a permanent error is re-sent
entry by entry so one bad message cannot dead-letter its neighbours, unless
the credentials were refused (:class:`~outrelay.transports._aws.DeniedError`:
every entry would be refused alike, so all are Rejected at once, with
``disable_destination`` — see :mod:`outrelay.transports._aws`); a retryable
whole-request error makes its entries RetryLater.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from outrelay.kit import Delivered, Message, PermanentError, Rejected, RetryableError, RetryLater, SendResult
from outrelay.transports._aws import AWSConfig, DeniedError, encoded_size, entry_outcome, fifo_id, structured_body

__all__ = ["BatchCall", "Entry", "chunks", "send_batch"]


@dataclasses.dataclass(slots=True)
class Entry:
    """One message ready for a batch API: its position in the batch, the
    request entry (``Id`` filled in per chunk) and its counted size."""

    index: int
    fields: dict[str, Any]
    size: int


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


BatchCall = Callable[[str, list[dict[str, Any]]], Awaitable[dict[str, Any]]]


async def send_entries(
    target: str, entries: Sequence[Entry], limit_bytes: int, api: BatchCall
) -> dict[int, SendResult]:
    """Send ``entries`` to ``target`` in concurrent chunks; results by batch index."""
    results: dict[int, SendResult] = {}

    async def one(chunk: list[Entry]) -> None:
        request = [{**e.fields, "Id": str(i)} for i, e in enumerate(chunk)]
        try:
            response = await api(target, request)
        except RetryableError as exc:
            for e in chunk:
                results[e.index] = RetryLater(str(exc), exc.retry_after)
            return
        except PermanentError as exc:
            denied = isinstance(exc, DeniedError)
            if len(chunk) == 1 or denied:
                for e in chunk:
                    results[e.index] = Rejected(str(exc), disable_destination=denied)
                return
            await asyncio.gather(*(one([e]) for e in chunk))
            return
        for ok in response.get("Successful", ()):
            results[chunk[int(ok["Id"])].index] = Delivered()
        for bad in response.get("Failed", ()):
            outcome = entry_outcome(str(bad.get("Code", "")), str(bad.get("Message", "")), bool(bad.get("SenderFault")))
            results[chunk[int(bad["Id"])].index] = outcome
        for e in chunk:
            results.setdefault(e.index, RetryLater("the service returned no result for this entry"))

    await asyncio.gather(*(one(c) for c in chunks(entries, limit_bytes)))
    return results


def prepare(
    batch: Sequence[Message], cfg: AWSConfig, fifo: bool, build: Callable[[Message, str], dict[str, Any]]
) -> tuple[list[SendResult | None], dict[str, list[Entry]]]:
    """Size-check and encode ``batch``: early rejections by index, entries grouped by target.

    ``build(message, body)`` returns the service's entry fields without ``Id``.
    """
    early: list[SendResult | None] = [None] * len(batch)
    by_target: dict[str, list[Entry]] = {}
    for i, m in enumerate(batch):
        if len(m.event.data) > cfg.max_data_bytes:
            size = len(m.event.data)
            early[i] = Rejected(f"event data of {size} bytes exceeds max_message_bytes={cfg.max_data_bytes}")
            continue
        body = structured_body(m.event)
        fields = build(m, body)
        attrs = fields.get("MessageAttributes", {})
        if fifo:
            fields["MessageGroupId"] = fifo_id(m.key)
            fields["MessageDeduplicationId"] = fifo_id(m.event.id)
        size = encoded_size(body, attrs)
        if size > cfg.message_limit:
            early[i] = Rejected(f"encoded CloudEvent of {size} bytes exceeds the service limit of {cfg.message_limit}")
            continue
        by_target.setdefault(m.target, []).append(Entry(i, fields, size))
    return early, by_target


async def send_batch(
    batch: Sequence[Message],
    cfg: AWSConfig,
    fifo: bool,
    build: Callable[[Message, str], dict[str, Any]],
    api: BatchCall,
) -> list[SendResult]:
    """The whole send(): prepare, send every target's chunks concurrently, collect in order."""
    early, by_target = prepare(batch, cfg, fifo, build)
    parts = await asyncio.gather(*(send_entries(t, es, cfg.message_limit, api) for t, es in by_target.items()))
    merged: dict[int, SendResult] = {}
    for p in parts:
        merged.update(p)
    return [r if r is not None else merged[i] for i, r in enumerate(early)]
