"""How a batch becomes XADDs: one Lua script call, or pipelined waves.

Redis runs a pipeline's commands in order but does not stop at a failed one,
so a plain pipeline could append event k+1 of a stream after event k failed.
Two ways keep ``ordered_batches`` honest:

* ``script`` (default): one ``EVALSHA`` runs every XADD of the batch inside
  Redis, atomically and in batch order, skipping the later events of a
  stream once one of its XADDs failed. One round trip per batch. Needs the
  ACL permission to run scripts (``+evalsha +eval``) besides ``+xadd``. The
  server is busy for the whole call (about 10-20 µs per event), which is why
  the transport caps one call at ~4 MiB of events.
* ``pipeline``: waves of pipelined XADDs (``transaction=False``), wave *k*
  holding the *k*-th event of every stream still in good standing. One round
  trip per wave, so a batch with many events per stream takes several; each
  wave's outcomes are reported as they arrive, and no wave starts once the
  send's progress refuses it (deadline near, or the relay stopping).

Both write the same entries as :func:`outrelay.transports.redis._wire.encode`
(same field names, values and order). The script path never builds that
dict: :func:`pack_chunk` turns a chunk into two arguments — a JSON header
(written by orjson, decoded by the script with ``cjson``) and the events'
data concatenated — because the relay's CPU per event is what limits
throughput, and unpacking runs in the server.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Sequence
from typing import Any

import orjson
from redis import exceptions as rx

from outrelay.kit import (
    STRUCTURED_CONTENT_TYPE,
    Delivered,
    Message,
    Progress,
    RetryLater,
    SendResult,
    attributes,
    deferred,
    to_structured,
)
from outrelay.transports.redis._client import Client
from outrelay.transports.redis._errors import reply_result, result_for

__all__ = ["HELD", "XADD_SCRIPT", "Entry", "pack_chunk", "script_outcomes", "send_scripted", "send_waves"]

HELD = "held back: an earlier event of this stream failed in this batch"

# KEYS: the chunk's distinct stream keys. ARGV[1]: JSON [shapes, options, producer id, entries];
# ARGV[2]: the entries' data, concatenated in entry order. A shape is [field name, value index, ...]:
# an entry's fields before "data", in XADD order. An entry is [key index, ordering key, shape index,
# [values], data length, event id]; its XADD is
#   XADD KEYS[key index] [IDMP <producer id> <event id>] <options> * <name_1> values[index_1] ... data <slice>
# (IDMP when the producer id is not false; options: MAXLEN ~ n or nothing).
# Reply: {status, error...}: status has one character per entry ("O" appended, "E" failed, "H" held
# back because an earlier XADD of its ordering key failed), then the error text of every "E" in order.
XADD_SCRIPT = """
local head = cjson.decode(ARGV[1])
local shapes, options, producer, entries = head[1], head[2], head[3], head[4]
local blob, sub, pcall, xunpack = ARGV[2], string.sub, redis.pcall, unpack
local failed, status, out = {}, {}, {''}
local off = 0
for e = 1, #entries do
  local entry = entries[e]
  local len = entry[5]
  if failed[entry[2]] then
    status[e] = 'H'
  else
    local args, n = {'XADD', KEYS[entry[1]]}, 2
    if producer then
      args[3], args[4], args[5] = 'IDMP', producer, entry[6]
      n = 5
    end
    for o = 1, #options do
      args[n + o] = options[o]
    end
    n = n + #options + 1
    args[n] = '*'
    local shape, vals = shapes[entry[3]], entry[4]
    for j = 1, #shape, 2 do
      args[n + 1] = shape[j]
      args[n + 2] = vals[shape[j + 1]]
      n = n + 2
    end
    args[n + 1] = 'data'
    args[n + 2] = sub(blob, off + 1, off + len)
    local r = pcall(xunpack(args))
    if type(r) == 'table' and r.err then
      failed[entry[2]] = true
      status[e] = 'E'
      out[#out + 1] = r.err
    else
      status[e] = 'O'
    end
  end
  off = off + len
end
out[1] = table.concat(status)
return out
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One XADD of the pipeline path: ``stream`` is the ordering key, ``key`` the Redis key,
    ``options`` what goes between the key and the id (IDMP, MAXLEN), ``fields`` the entry's
    field/value pairs."""

    stream: str
    key: str
    options: list[Any]
    fields: dict[str, str | bytes]


_STRUCTURED_SHAPE: list[str | int] = ["content-type", 1]
_STRUCTURED_VALUES = (STRUCTURED_CONTENT_TYPE,)


def _binary_shape(names: tuple[str, ...]) -> list[str | int]:
    """The shape of an event whose :func:`attributes` has ``names`` (in that order):
    ``ce_<name>`` for every attribute but ``datacontenttype``, then ``content-type`` — the
    fields of ``encode(event, "binary")`` before ``data`` (``datacontenttype`` is present exactly
    when ``event.content_type`` is set, and holds it)."""
    shape: list[str | int] = []
    for index, name in enumerate(names, 1):
        if name != "datacontenttype":
            shape += ("ce_" + name, index)
    if "datacontenttype" in names:
        shape += ("content-type", names.index("datacontenttype") + 1)
    return shape


def pack_chunk(
    messages: Sequence[Message], *, mode: str, producer_id: str | None, head: list[str]
) -> tuple[list[str], bytes, bytes]:
    """``(keys, header, data)``: the KEYS and the two ARGV of one :data:`XADD_SCRIPT` call.

    ``producer_id`` adds ``IDMP producer_id <event id>`` to every XADD (None: no IDMP);
    ``head`` holds further options (``MAXLEN ~ n``), as strings.
    """
    keys: dict[str, int] = {}
    shapes: list[list[str | int]] = []
    shape_ids: dict[tuple[str, ...], int] = {}
    rows: list[tuple[Any, ...]] = []
    datas: list[bytes] = []
    structured = mode == "structured"
    if structured:
        shapes.append(_STRUCTURED_SHAPE)
    for m in messages:
        event = m.event
        index = keys.get(m.target)
        if index is None:
            index = keys[m.target] = len(keys) + 1
        if structured:
            data = to_structured(event)
            rows.append((index, m.key, 1, _STRUCTURED_VALUES, len(data), event.id))
        else:
            attrs = attributes(event)
            names = tuple(attrs)
            shape = shape_ids.get(names)
            if shape is None:
                shapes.append(_binary_shape(names))
                shape = shape_ids[names] = len(shapes)
            data = event.data
            rows.append((index, m.key, shape, tuple(attrs.values()), len(data), event.id))
        datas.append(data)
    header = orjson.dumps((shapes, head, False if producer_id is None else producer_id, rows))
    return list(keys), header, b"".join(datas)


async def send_scripted(
    script: Any, messages: Sequence[Message], *, mode: str, producer_id: str | None, head: list[str]
) -> list[SendResult]:
    """Append ``messages`` through :data:`XADD_SCRIPT` in one call (see :func:`pack_chunk` for the
    options); errors of the call itself propagate."""
    keys, header, data = pack_chunk(messages, mode=mode, producer_id=producer_id, head=head)
    return script_outcomes(await script(keys=keys, args=[header, data]), len(messages))


def script_outcomes(reply: Any, n: int) -> list[SendResult]:
    """The outcomes of the ``n`` entries of one :data:`XADD_SCRIPT` call from its reply.

    :raises RedisError: (retryable) the reply does not hold ``n`` outcomes.
    """
    status = reply[0] if isinstance(reply[0], bytes) else str(reply[0]).encode()
    if len(status) != n:
        raise rx.RedisError(f"the XADD script answered {len(status)} outcomes for {n} entries")  # retryable
    if len(reply) == 1 and status == b"O" * n:
        return [Delivered()] * n  # one shared (frozen) instance
    errors = iter(reply[1:])
    out: list[SendResult] = []
    for c in status:
        if c == 0x4F:  # O
            out.append(Delivered())
        elif c == 0x48:  # H
            out.append(RetryLater(HELD))
        else:
            error = next(errors, b"unknown error")
            out.append(reply_result(error.decode("utf-8", "replace") if isinstance(error, bytes) else str(error)))
    return out


def _waves(entries: Sequence[Entry]) -> list[list[int]]:
    """Indexes into ``entries``: wave *k* holds the *k*-th entry of every stream."""
    waves: list[list[int]] = []
    depth: dict[str, int] = {}
    for i, entry in enumerate(entries):
        k = depth[entry.stream] = depth.get(entry.stream, -1) + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(i)
    return waves


async def send_waves(
    client: Client, entries: Sequence[Entry], messages: Sequence[Message], progress: Progress
) -> list[SendResult]:
    """Pipelined waves (see the module docstring) of ``entries`` (those of ``messages``, in order); errors
    of a whole round trip propagate. Each wave's outcomes are reported to ``progress`` as its replies
    arrive, and a later wave is started only if ``progress.may_start`` allows it (expecting the last
    wave's time), else what is left is :func:`~outrelay.kit.deferred` (NotSent)."""
    results: list[SendResult | None] = [None] * len(entries)
    waves = _waves(entries)
    failed: set[str] = set()
    loop = asyncio.get_running_loop()
    latency = 0.0
    for w, wave in enumerate(waves):
        if w and not progress.may_start(expected=latency):
            later = deferred(progress)
            results = [later if r is None else r for r in results]
            break
        todo = [i for i in wave if entries[i].stream not in failed]
        for i in wave:
            if entries[i].stream in failed:
                results[i] = RetryLater(HELD)
        if not todo:
            continue
        pipe = client.pipeline(transaction=False)
        for i in todo:
            e = entries[i]
            flat = [x for pair in e.fields.items() for x in pair]
            pipe.execute_command("XADD", e.key, *e.options, "*", *flat)
        started = loop.time()
        replies = await pipe.execute(raise_on_error=False)
        latency = loop.time() - started
        for i, reply in zip(todo, replies, strict=True):
            result = result_for(reply) if isinstance(reply, Exception) else Delivered()
            if not isinstance(result, Delivered):
                failed.add(entries[i].stream)
            results[i] = result
            progress.report(messages[i], result)
    return [r if r is not None else RetryLater("no outcome recorded") for r in results]
