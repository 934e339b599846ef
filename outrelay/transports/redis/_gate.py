"""The per-stream gate of a Redis consumer group: Lua scripts and the release rule.

Redis hands consecutive entries of one stream key to different members of a
group, so a member cannot tell on its own whether an earlier entry of the
same ordering key (the event's stream) is still being handled elsewhere. The
gate is one Redis list per (stream key, group, ordering key) holding the
entry ids delivered to the group and not yet acked, in delivery (= id)
order:

* :data:`READ` runs ``XREADGROUP ... COUNT n STREAMS key >`` without
  blocking and, in the same atomic step, ``RPUSH``es each entry's id onto its
  list; it replies with the entries, their ordering keys and a snapshot of
  every list it touched, packed into one JSON string by the server's cjson
  (:func:`unpack_read`): one string costs the client one read and a C parse,
  where a nested array of every field costs one step of redis-py's
  pure-Python parser per field (that parser was most of a member's CPU).
* :data:`ACK` runs ``XACK`` and ``LREM`` together, so a list holds exactly
  the group's unacked entries of that ordering key and empties (Redis then
  deletes the key) when they are all acked.
* :func:`releasable` is the rule a member applies to a list snapshot: it may
  hand over one of its entries once every listed id below it is one it has
  handed over itself (or is handing over now, in order).
* :data:`REFRESH` resets the idle time of the entries a live member holds
  (only those it still owns), so ``XAUTOCLAIM`` never takes them;
  :data:`HANDOVER` makes a stopping member's entries claimable at once;
  :data:`REPAIR` drops list ids that are no longer pending (an entry trimmed
  by ``MAXLEN`` or deleted while pending), which would otherwise block their
  list for ever.

The ordering key is the field ``ce_streamid`` (else ``ce_partitionkey``) in
binary mode and ``streamid`` (else ``partitionkey``) of the JSON event in
structured mode — what the reader decodes as ``event.stream``. An entry
without one (a foreign message) is not gated.

The scripts touch keys derived from the stream key that they do not declare,
which a server allows as long as they are in the declared key's slot. On a
cluster :func:`gate_prefix` makes sure of that: a key with a hash tag
(``events:{orders}``) passes it on to ``events:{orders}:gate:...``, a key
without one is wrapped whole in braces (``{events}:gate:...``, whose tag is
the key itself). Standalone keeps the plain prefix.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Any, TypeAlias

import orjson

from outrelay.kit import STRUCTURED_CONTENT_TYPE

__all__ = [
    "ACK",
    "FORGET",
    "HANDOVER",
    "READ",
    "REFRESH",
    "REPAIR",
    "ReadEntry",
    "gate_prefix",
    "id_order",
    "ordering_key",
    "releasable",
    "unpack_read",
]

#: An entry :data:`READ` delivered: its id, its fields (names and values as the server holds them,
#: bytes) and its ordering key (``""``: not gated).
ReadEntry: TypeAlias = tuple[str, dict[bytes, bytes], str]

# KEYS[1] stream; ARGV: group, consumer, count, gate prefix.
# Reply: {n, packed, last}: n entries delivered and, packed with cjson (see unpack_read), {entries, ordering
# keys ('' = ungated), {key, snapshot, ...}}; last is the stream's last entry id when nothing new was delivered
# (wait from there), else ''.
READ = """
local reply = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS', KEYS[1], '>')
if not reply then
  local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
  return {0, '', last[1] and last[1][1] or '0-0'}
end
local entries, keys, touched, order = reply[1][2], {}, {}, {}
for i = 1, #entries do
  local id, f = entries[i][1], entries[i][2]
  local sid, pk, ctype, data = nil, nil, nil, nil
  for j = 1, #f, 2 do
    local name = string.lower(f[j])
    if name == 'ce_streamid' then sid = f[j + 1]
    elseif name == 'ce_partitionkey' then pk = f[j + 1]
    elseif name == 'content-type' then ctype = string.lower(f[j + 1])
    elseif name == 'data' then data = f[j + 1] end
  end
  local key = sid or pk
  if not key and data and ctype and string.sub(ctype, 1, 28) == 'application/cloudevents+json' then
    local ok, doc = pcall(cjson.decode, data)
    if ok and type(doc) == 'table' then
      if type(doc.streamid) == 'string' then key = doc.streamid
      elseif type(doc.partitionkey) == 'string' then key = doc.partitionkey end
    end
  end
  key = key or ''
  keys[i] = key
  if key ~= '' then
    redis.call('RPUSH', ARGV[4] .. key, id)
    if not touched[key] then
      touched[key] = true
      order[#order + 1] = key
    end
  end
end
local lists = {}
for _, key in ipairs(order) do
  lists[#lists + 1] = key
  lists[#lists + 1] = redis.call('LRANGE', ARGV[4] .. key, 0, -1)
end
return {#entries, cjson.encode({entries, keys, lists}), ''}
"""

# KEYS[1] stream; ARGV: group, gate prefix, then id, ordering key pairs. Reply: number acked.
ACK = """
local n = 0
for i = 3, #ARGV, 2 do
  n = n + redis.call('XACK', KEYS[1], ARGV[1], ARGV[i])
  if ARGV[i + 1] ~= '' then redis.call('LREM', ARGV[2] .. ARGV[i + 1], 1, ARGV[i]) end
end
return n
"""

# KEYS[1] stream; ARGV: group, consumer, idle ms, ids. Re-claims the ids this consumer still owns, setting
# their idle time (JUSTID: the delivery count stays); replies with the ids it no longer owns. REFRESH (idle 0)
# keeps a live member's entries from XAUTOCLAIM; HANDOVER (a huge idle) makes them claimable at once.
REFRESH = """
local owned, lost = {}, {}
for i = 4, #ARGV do
  local p = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)
  if p[1] and p[1][2] == ARGV[2] then owned[#owned + 1] = ARGV[i] else lost[#lost + 1] = ARGV[i] end
end
for lo = 1, #owned, 500 do
  local args = {KEYS[1], ARGV[1], ARGV[2], 0, unpack(owned, lo, math.min(lo + 499, #owned))}
  args[#args + 1] = 'IDLE'
  args[#args + 1] = ARGV[3]
  args[#args + 1] = 'JUSTID'
  redis.call('XCLAIM', unpack(args))
end
return lost
"""
HANDOVER = REFRESH

# KEYS[1] stream; ARGV: group, consumer. Deletes the consumer when it has no pending entry; replies 1 if so.
FORGET = """
if #redis.call('XPENDING', KEYS[1], ARGV[1], '-', '+', 1, ARGV[2]) == 0 then
  return redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], ARGV[2]) + 1
end
return 0
"""

# KEYS[1] stream; ARGV: group, list key, ids. Removes the ids that are no longer pending; replies how many.
REPAIR = """
local n = 0
for i = 3, #ARGV do
  if #redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1) == 0 then
    n = n + redis.call('LREM', ARGV[2], 0, ARGV[i])
  end
end
return n
"""


def gate_prefix(key: str, group: str, *, cluster: bool = False) -> str:
    """Prefix of the gate lists of ``group`` on ``key`` (the group's length keeps names unambiguous);
    on a ``cluster`` the lists hash to ``key``'s slot (see the module docstring).

    :raises ValueError: ``cluster`` and ``key`` has no hash tag but holds a ``}``, so no prefix can
        share its slot.
    """
    if cluster and not _has_hash_tag(key):
        if "}" in key:
            raise ValueError(
                f"stream key {key!r} has no hash tag and contains '}}': the consumer group's gate lists cannot "
                "share its cluster slot; give the key a hash tag (e.g. 'events:{orders}')"
            )
        return f"{{{key}}}:gate:{len(group)}:{group}:"
    return f"{key}:gate:{len(group)}:{group}:"


def _has_hash_tag(key: str) -> bool:
    """Redis Cluster's rule: a non-empty part between the first ``{`` and the next ``}`` is hashed alone."""
    start = key.find("{")
    return start >= 0 and key.find("}", start + 1) > start + 1


def id_order(entry_id: str) -> tuple[int, int]:
    """Sort key of a stream entry id (``ms-seq``)."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def _text(v: Any) -> str:
    return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)


def ordering_key(fields: Mapping[Any, Any]) -> str:
    """The gate's ordering key of an entry (same rule as :data:`READ`); ``""``: not gated."""
    raw = {_text(k).lower(): v for k, v in fields.items()}
    for name in ("ce_streamid", "ce_partitionkey"):
        if name in raw:
            return _text(raw[name])
    ctype = _text(raw.get("content-type", "")).lower()
    if ctype.startswith(STRUCTURED_CONTENT_TYPE) and "data" in raw:
        try:
            doc = orjson.loads(raw["data"])
        except orjson.JSONDecodeError:
            return ""
        if isinstance(doc, dict):
            for name in ("streamid", "partitionkey"):
                if isinstance(doc.get(name), str):
                    return str(doc[name])
    return ""


def unpack_read(reply: Sequence[Any]) -> tuple[list[ReadEntry], dict[str, list[str]], str]:
    """The entries, the list snapshots (ordering key -> ids) and the ``last`` id of a :data:`READ` reply.

    The reply is ``[n, packed, last]``; ``packed`` is ``[entries, keys, lists]``
    encoded by the server's cjson, which copies every byte from 0x80 up
    unchanged and escapes the others that JSON does not allow in a string: read
    as Latin-1 the JSON is valid whatever the bytes (a binary ``data``, a
    field name that is not UTF-8), and encoding each string back to Latin-1
    gives its exact bytes. The price is on the wire: a byte below 0x20 (or
    ``"``, ``\\``, ``/``) takes two to six bytes, so a binary ``data`` made of
    such bytes can grow up to six times in this reply (text and JSON barely grow).

    :raises ValueError: the reply is not of that shape (a script of another version).
    """
    n, packed, last = reply
    if not int(n):
        return [], {}, _text(last)
    try:
        rows, keys, lists = orjson.loads(packed.decode("latin-1"))
    except (orjson.JSONDecodeError, TypeError, ValueError) as exc:
        raise ValueError(f"gate READ reply: not [entries, keys, lists]: {exc}") from None
    if len(rows) != int(n) or len(keys) != len(rows) or not isinstance(lists, list | dict):
        raise ValueError(f"gate READ reply: {len(rows)} entries and {len(keys)} keys, {n} announced")
    entries: list[ReadEntry] = []
    for (entry_id, flat), key in zip(rows, keys, strict=True):
        raw = [x.encode("latin-1") for x in flat]
        fields = dict(zip(raw[::2], raw[1::2], strict=True))
        entries.append((entry_id, fields, key.encode("latin-1").decode("utf-8", "replace")))
    snapshots = {  # an empty Lua table comes out as {}: no list touched
        lists[i].encode("latin-1").decode("utf-8", "replace"): list(lists[i + 1] or ())
        for i in range(0, len(lists) if isinstance(lists, list) else 0, 2)
    }
    return entries, snapshots, ""


def releasable(held: Sequence[str], mine: Collection[str], snapshot: Iterable[str]) -> int:
    """How many of ``held`` (this member's waiting ids of one list, ascending) it may hand over now.

    ``mine`` holds the ids it already handed over and not acked; ``snapshot``
    is the list as read from Redis. An id may go once every listed id below
    it is mine or one of ``held`` going before it: the count is that of the
    ``held`` ids below the lowest foreign id of the snapshot.
    """
    waiting = set(held)
    foreign = [id_order(i) for i in snapshot if i not in mine and i not in waiting]
    if not foreign:
        return len(held)
    lowest = min(foreign)
    n = 0
    while n < len(held) and id_order(held[n]) < lowest:
        n += 1
    return n
