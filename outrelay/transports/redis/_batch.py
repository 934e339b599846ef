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
  trip per wave, so a batch with many events per stream takes several.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import redis.asyncio as aioredis

from outrelay.core.transport import Delivered, RetryLater, SendResult
from outrelay.transports.redis._errors import reply_result, result_for

__all__ = ["HELD", "XADD_SCRIPT", "Entry", "pack_fields", "send_pipelined", "send_scripted"]

HELD = "held back: an earlier event of this stream failed in this batch"

# ARGV: count, then per entry: key index, ordering key, n, n XADD options (IDMP/MAXLEN), and the
# fields packed as "<len>:<bytes><len>:<bytes>..." (one argument instead of ~22: the client's
# per-argument encoding is what costs, and unpacking here runs in the server, off the relay's CPU).
# Replies per entry: "I<id>" appended, "E<error>" failed, "H" held back.
XADD_SCRIPT = """
local function unpack_fields(s, args)
  local i, n = 1, #s
  while i <= n do
    local c = string.find(s, ':', i, true)
    local len = tonumber(string.sub(s, i, c - 1))
    args[#args + 1] = string.sub(s, c + 1, c + len)
    i = c + len + 1
  end
end
local count = tonumber(ARGV[1])
local pos = 2
local failed = {}
local out = {}
for e = 1, count do
  local kidx = tonumber(ARGV[pos])
  local stream = ARGV[pos + 1]
  local nopts = tonumber(ARGV[pos + 2])
  pos = pos + 3
  if failed[stream] then
    out[e] = 'H'
  else
    local args = {'XADD', KEYS[kidx]}
    for o = pos, pos + nopts - 1 do
      args[#args + 1] = ARGV[o]
    end
    args[#args + 1] = '*'
    unpack_fields(ARGV[pos + nopts], args)
    local r = redis.pcall(unpack(args))
    if type(r) == 'table' and r.err then
      failed[stream] = true
      out[e] = 'E' .. r.err
    else
      out[e] = 'I' .. r
    end
  end
  pos = pos + nopts + 1
end
return out
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """One XADD: ``stream`` is the ordering key, ``key`` the Redis key, ``options`` what goes
    between the key and the id (IDMP, MAXLEN), ``fields`` the entry's field/value pairs."""

    stream: str
    key: str
    options: list[Any]
    fields: dict[str, str | bytes]


def pack_fields(fields: dict[str, str | bytes]) -> bytes:
    """The fields as ``<len>:<bytes>`` runs, names and values alternating (decoded by the script)."""
    parts = []
    for name, value in fields.items():
        nb = name.encode()
        vb = value if isinstance(value, bytes) else value.encode()
        parts.append(b"%d:%b%d:%b" % (len(nb), nb, len(vb), vb))
    return b"".join(parts)


async def send_scripted(script: Any, entries: Sequence[Entry]) -> list[SendResult]:
    """Run every entry through :data:`XADD_SCRIPT` in one call (errors of the call itself propagate)."""
    keys: dict[str, int] = {}
    args: list[Any] = [len(entries)]
    for e in entries:
        index = keys.setdefault(e.key, len(keys) + 1)
        args += (index, e.stream, len(e.options), *e.options, pack_fields(e.fields))
    replies = await script(keys=list(keys), args=args)
    out: list[SendResult] = []
    for reply in replies:
        text = reply.decode("utf-8", "replace") if isinstance(reply, bytes) else str(reply)
        if text.startswith("I"):
            out.append(Delivered())
        elif text.startswith("H"):
            out.append(RetryLater(HELD))
        else:
            out.append(reply_result(text[1:]))
    return out


async def send_pipelined(client: aioredis.Redis, entries: Sequence[Entry]) -> list[SendResult]:
    """Pipelined waves (see the module docstring); errors of a whole round trip propagate."""
    results: list[SendResult | None] = [None] * len(entries)
    waves: list[list[int]] = []
    depth: dict[str, int] = {}
    for i, entry in enumerate(entries):
        k = depth[entry.stream] = depth.get(entry.stream, -1) + 1
        if k == len(waves):
            waves.append([])
        waves[k].append(i)
    failed: set[str] = set()
    for wave in waves:
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
        replies = await pipe.execute(raise_on_error=False)
        for i, reply in zip(todo, replies, strict=True):
            if isinstance(reply, Exception):
                results[i] = result_for(reply)
                failed.add(entries[i].stream)
            else:
                results[i] = Delivered()
    return [r if r is not None else RetryLater("no outcome recorded") for r in results]
