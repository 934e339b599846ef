"""Atomic batches: a relay batch published as one JetStream atomic batch (nats-server 2.12+).

A stream created with ``allow_atomic`` stores a batch of messages all
together or not at all. Every message carries ``Nats-Batch-Id`` (one id per
batch) and ``Nats-Batch-Sequence`` (1, 2, …); the last one also carries
``Nats-Batch-Commit: 1``. The leader stages the batch in memory and, on the
commit, checks it and proposes it as one entry of the stream's log; only the
commit is acknowledged (a pub ack naming the batch and its count). The
members before the commit are published without a reply subject: written
back to back with the commit in one command, so a batch costs one write and
one ack, not one round trip per message.

Why this makes pipelining safe on a cluster: the break in order that
pipelining risks (docs/clusters.md) is a stream leader change dropping
message *k* while *k+1*, already on the wire, is stored. Inside an atomic
batch that cannot happen — a leader change abandons the batch, so *k+1* is
stored only with *k* — and across batches the relay sends a stream's next
batch only after the previous one settled (its lanes stay leased meanwhile),
so a stream has one batch in flight at a time.

Outcomes of one batch:

* the pub ack: every member :class:`Delivered`;
* no ack within ``ack_timeout`` or a lost connection: every member
  RetryLater — nothing was stored, or (after a lost ack) all of it was, and
  the re-send is deduplicated (below);
* an error answer, which means nothing of the batch was stored: abandoned
  as incomplete (10176: a member lost on the way, e.g. in a leader change,
  or members whose subjects belong to another JetStream stream), more
  than the server's 1,000 messages (10199), a message id the stream
  already stored (10201: a re-send after a lost ack; the server refuses the
  whole batch rather than drop the duplicate), atomic publishing turned off
  on the stream (10174), a refusal about one message (too large, wrong
  stream), no responders: the members are sent again at once with one
  unacked message per stream (:func:`~outrelay.kit.send_chained`,
  safe on a cluster), so each gets its own outcome — a stored duplicate is
  then acked as one by the duplicate window. (Retrying the batch as a whole
  could refuse it forever.) A batch spans one JetStream stream: a
  destination whose subjects fall into several streams pays that fallback
  on every batch — give it one stream (``expected_stream``).

A message that cannot be published at all (too large, bad subject) is
Rejected before the batch is written and the later members of its stream are
held back (RetryLater), as in a pipelined batch.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats.errors
import nats.js.errors

from outrelay.kit import (
    Delivered,
    Message,
    Progress,
    RetryLater,
    SendResult,
    current_progress,
    deferred,
    hold_after_failures,
    not_sent,
)
from outrelay.transports.nats._acks import AckMux, log
from outrelay.transports.nats._errors import result_for

__all__ = ["ABANDONED", "DISABLED", "send_atomic"]

ABANDONED = 10176  # the batch was incomplete and abandoned (a gap, a leader change): nothing stored
DISABLED = 10174  # the stream does not allow atomic publishing (any more)


async def send_atomic(
    batch: Sequence[Message],
    acks: AckMux,
    prepare: Callable[[Message], dict[str, str] | SendResult],
    fallback: Callable[[Sequence[Message]], Awaitable[list[SendResult]]],
    *,
    timeout: float,
    destination: str,
    on_disabled: Callable[[], None],
) -> list[SendResult]:
    """Publish ``batch`` as one atomic batch; see the module docstring for the outcomes.

    ``prepare(m)`` gives a member's headers (or its result when it cannot be published);
    ``fallback(members)`` sends members one unacked message per stream when the batch as a
    whole was refused; ``on_disabled()`` is called when the stream no longer allows atomic
    batches (10174), before that fallback.

    Progress: nothing is written once the relay is stopping (every member deferred); the
    commit's ack reports every member Delivered at once (before anything else can cut the
    send), and the fallback reports each message as its ack comes.
    """
    progress = current_progress()
    if progress.stopped:
        return [deferred(progress) for _ in batch]
    results: list[SendResult | None] = [None] * len(batch)
    members: list[tuple[int, Message, dict[str, str]]] = []
    halted: set[str] = set()
    for i, m in enumerate(batch):
        if m.key in halted:
            results[i] = not_sent(m.key)
            continue
        prepared = prepare(m)
        if not isinstance(prepared, dict):
            results[i] = prepared
            halted.add(m.key)
            continue
        members.append((i, m, prepared))
    if members:
        outcomes = await _publish(members, acks, fallback, timeout, on_disabled, progress)
        for (i, _, _), result in zip(members, outcomes, strict=True):
            results[i] = result
    out = [r if r is not None else RetryLater("no outcome recorded") for r in results]
    out = hold_after_failures(batch, out, destination=destination, log=log, fix="set pipeline = false")
    progress.record(batch, out)
    return out


async def _publish(
    members: list[tuple[int, Message, dict[str, str]]],
    acks: AckMux,
    fallback: Callable[[Sequence[Message]], Awaitable[list[SendResult]]],
    timeout: float,
    on_disabled: Callable[[], None],
    progress: Progress,
) -> list[SendResult]:
    """Write ``members`` as one batch, wait for the commit's ack, and map it to their results
    (Delivered reported to ``progress`` as soon as the commit is acked)."""
    batch_id = uuid.uuid4().hex
    last = len(members)
    commit: asyncio.Future[dict[str, Any]] | None = None
    try:
        for n, (_, m, headers) in enumerate(members, start=1):
            headers["Nats-Batch-Id"] = batch_id
            headers["Nats-Batch-Sequence"] = str(n)
            if n < last:
                acks.stage_unacked(m.target, m.event.data, headers)
            else:
                headers["Nats-Batch-Commit"] = "1"
                commit = acks.stage(m.target, m.event.data, headers)
        await acks.flush()
    except (nats.errors.Error, OSError) as exc:  # nothing (or an incomplete batch the server abandons) went out
        acks.unstage()  # cancels the commit's future if it was staged and not flushed
        return [result_for(exc, m.target) for _, m, _ in members]
    assert commit is not None
    messages = [m for _, m, _ in members]
    commit.add_done_callback(lambda f: _stored(f, messages, progress))
    try:
        await asyncio.wait_for(commit, timeout)
    except (nats.js.errors.APIError, nats.js.errors.NoStreamResponseError) as exc:
        # an answer: the batch was not stored (abandoned as incomplete, too large, a stored duplicate,
        # atomic turned off, a refused or stream-less member, no leader now): each member gets its own outcome
        if isinstance(exc, nats.js.errors.APIError) and exc.err_code == DISABLED:
            on_disabled()
        log.debug("atomic batch of %d not stored (%s): sending it one message per stream", last, exc)
        return await fallback([m for _, m, _ in members])
    except (TimeoutError, nats.errors.Error, OSError) as exc:  # no answer: it may be stored; retried (deduped)
        return [result_for(exc, m.target) for _, m, _ in members]
    return [Delivered() for _ in members]  # the commit's pub ack: the whole batch is stored


def _stored(commit: asyncio.Future[dict[str, Any]], messages: list[Message], progress: Progress) -> None:
    """The commit's ack came: every member is stored, whatever cuts the send afterwards."""
    if not commit.cancelled() and commit.exception() is None:
        progress.record(messages, [Delivered() for _ in messages])
