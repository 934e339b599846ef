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
after it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from redis import exceptions as rx
from redis.asyncio.cluster import RedisCluster
from redis.crc import key_slot

from outrelay.kit import Delivered, Message, PermanentError, Rejected, RetryLater, SendResult, TransportError
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
) -> list[SendResult]:
    """Append ``messages`` to a cluster with one script call per slot group (module docstring).

    :raises RetryableError: the first phase's round trip failed as a whole.
    :raises PermanentError: likewise, for a permanent reason (authentication, ACL).
    """
    results: list[SendResult | None] = [None] * len(messages)
    failed: set[str] = set()
    for p, phase in enumerate(plan(messages)):
        groups: list[list[int]] = []
        for group in phase:
            todo = [i for i in group if messages[i].key not in failed]
            for i in group:
                if messages[i].key in failed:
                    results[i] = RetryLater(HELD)
            if todo:
                groups.append(todo)
        if not groups:
            continue
        calls = [pack_chunk([messages[i] for i in g], mode=mode, producer_id=producer_id, head=head) for g in groups]
        try:
            with map_redis_errors(f"XADD to {where}", destination):
                replies = await _run(client, sha, calls)
        except TransportError as exc:
            if p == 0:
                raise
            outcome: SendResult = Rejected(str(exc)) if isinstance(exc, PermanentError) else RetryLater(str(exc))
            return [r if r is not None else outcome for r in results]
        for group, reply in zip(groups, replies, strict=True):
            outcomes: list[SendResult]
            if isinstance(reply, BaseException):
                outcomes = [result_for(reply)] * len(group)
            else:
                try:
                    outcomes = script_outcomes(reply, len(group))
                except rx.RedisError as exc:
                    outcomes = [result_for(exc)] * len(group)
            for i, outcome in zip(group, outcomes, strict=True):
                results[i] = outcome
                if not isinstance(outcome, Delivered):
                    failed.add(messages[i].key)
    return [r if r is not None else RetryLater("no outcome recorded") for r in results]


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
