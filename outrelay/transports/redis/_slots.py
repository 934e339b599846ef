"""The script path on a Redis Cluster: one script call per hash slot, in phases.

A Lua script may only touch keys of one slot (else ``CROSSSLOT``), so a
chunk is split by the slot of each message's key (``CRC16(key or hash tag)
mod 16384``). Every stream's events keep their batch order:

* **groups**: the messages of one slot, in batch order, go to one
  :data:`~outrelay.transports.redis._batch.XADD_SCRIPT` call, which appends
  them in that order and holds back a stream's later events after one fails;
* **phases**: a stream whose events map to keys in several slots (a
  template such as ``events:{type}``) moves to the next phase each time its
  slot changes, so its events in slot B wait for its earlier ones in slot A.
  With one key per stream (``events:{stream}``) there is one phase.

A phase is one non-transactional pipeline holding one ``EVALSHA`` per group:
redis-py sends each node its share concurrently (one round trip per node),
follows ``MOVED``/``ASK`` and waits out ``TRYAGAIN`` per command. A node that
has not cached the script (a replica promoted by a failover) answers
``NOSCRIPT``: the script is loaded on every primary and those groups are sent
again (nothing of theirs ran). A group whose call failed as a whole gets that
error as every event's outcome, and its streams' events in later phases are
held back. An error of a whole round trip propagates in the first phase
(nothing is known to have gone out) and becomes every later event's outcome
after it. Each phase's outcomes are reported to the send's progress as they
arrive, and no later phase starts once the progress refuses it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rx
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from outrelay.kit import (
    Delivered,
    Message,
    PermanentError,
    Progress,
    Rejected,
    RetryLater,
    SendResult,
    TransportError,
    deferred,
)
from outrelay.transports.redis._batch import HELD, XADD_SCRIPT, pack_chunk, script_outcomes
from outrelay.transports.redis._errors import map_redis_errors, result_for

__all__ = ["plan", "send_slotted"]


def plan(messages: Sequence[Message]) -> list[list[list[int]]]:
    """Phases of groups of indexes into ``messages`` (see the module docstring): within a phase
    a stream's messages are in one group, in order; its later messages are in later phases."""
    slots: dict[str, int] = {}
    where: dict[str, tuple[int, int]] = {}  # ordering key -> (phase, slot) of its last message
    phases: list[dict[int, list[int]]] = []
    for i, m in enumerate(messages):
        slot = slots.get(m.target)
        if slot is None:
            slot = slots[m.target] = key_slot(m.target.encode())
        last = where.get(m.key)
        phase = 0 if last is None else last[0] if last[1] == slot else last[0] + 1
        where[m.key] = (phase, slot)
        if phase == len(phases):
            phases.append({})
        phases[phase].setdefault(slot, []).append(i)
    return [list(groups.values()) for groups in phases]


async def send_slotted(
    client: RedisCluster,
    messages: Sequence[Message],
    *,
    sha: str,
    mode: str,
    producer_id: str | None,
    head: list[str],
    where: str,
    destination: str,
    progress: Progress,
) -> list[SendResult]:
    """Append ``messages`` to a cluster with one script call per slot group (module docstring). Each
    phase's outcomes are reported to ``progress`` as its replies arrive; a later phase starts only if
    ``progress.may_start`` allows it (else what is left is :func:`~outrelay.kit.deferred`, NotSent).

    :raises RetryableError: the first phase's round trip failed as a whole.
    :raises PermanentError: likewise, for a permanent reason (authentication, ACL).
    """
    results: list[SendResult | None] = [None] * len(messages)
    failed: set[str] = set()
    loop = asyncio.get_running_loop()
    latency = 0.0
    for p, phase in enumerate(plan(messages)):
        if p and not progress.may_start(expected=latency):
            later = deferred(progress)
            return [r if r is not None else later for r in results]
        groups = _todo(messages, phase, failed, results)
        if not groups:
            continue
        calls = [pack_chunk([messages[i] for i in g], mode=mode, producer_id=producer_id, head=head) for g in groups]
        started = loop.time()
        try:
            with map_redis_errors(f"XADD to {where}", destination):
                replies = await _run(client, sha, calls)
        except TransportError as exc:
            if p == 0:
                raise
            outcome: SendResult = Rejected(str(exc)) if isinstance(exc, PermanentError) else RetryLater(str(exc))
            return [r if r is not None else outcome for r in results]
        latency = loop.time() - started
        for group, reply in zip(groups, replies, strict=True):
            for i, outcome in zip(group, _outcomes(reply, len(group)), strict=True):
                results[i] = outcome
                progress.report(messages[i], outcome)
                if not isinstance(outcome, Delivered):
                    failed.add(messages[i].key)
    return [r if r is not None else RetryLater("no outcome recorded") for r in results]


def _todo(
    messages: Sequence[Message], phase: list[list[int]], failed: set[str], results: list[SendResult | None]
) -> list[list[int]]:
    """The groups of ``phase`` without the messages of streams that failed earlier (held back in ``results``)."""
    groups: list[list[int]] = []
    for group in phase:
        todo = [i for i in group if messages[i].key not in failed]
        for i in group:
            if messages[i].key in failed:
                results[i] = RetryLater(HELD)
        if todo:
            groups.append(todo)
    return groups


def _outcomes(reply: Any, n: int) -> list[SendResult]:
    """The ``n`` outcomes of one group's script call from its reply (or the error it got)."""
    if isinstance(reply, BaseException):
        return [result_for(reply)] * n
    try:
        return script_outcomes(reply, n)
    except rx.RedisError as exc:
        return [result_for(exc)] * n


async def _run(client: RedisCluster, sha: str, calls: list[tuple[list[str], bytes, bytes]]) -> list[Any]:
    """One pipeline of ``EVALSHA`` calls; replies (or the error of each call), in order."""
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = client.pipeline(transaction=False)
        for c in todo:
            keys, header, data = calls[c]
            # redis-py blocks pipe.evalsha on a cluster (a script's keys may span slots, and it does not
            # reload scripts in a pipeline); these keys share a slot and NOSCRIPT is handled below
            pipe.execute_command("EVALSHA", sha, len(keys), *keys, header, data)
        for c, reply in zip(todo, await pipe.execute(raise_on_error=False), strict=True):
            replies[c] = reply
        todo = [c for c in todo if isinstance(replies[c], rx.NoScriptError)]
        if not todo or attempt:
            break
        await client.script_load(XADD_SCRIPT)  # on every primary; nothing of the NOSCRIPT calls ran
    return replies
