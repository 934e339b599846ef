"""Consumer side of the ``redis`` transport: a Redis Streams consumer group.

``start`` creates the group at the stream's end (``$``; ``0`` with
``from_beginning=True``), creating the stream if needed (``MKSTREAM``), so
the reader sees what is appended afterwards. ``read`` uses ``XREADGROUP``
and acknowledges (``XACK``) what it returns. A group the reader generated
itself (no ``group`` given) is destroyed on ``stop``; a named group stays,
so a later reader with the same name resumes after the last acknowledged
entry.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping
from typing import Any

from redis import exceptions as rx

from outrelay.kit import Reader, Received, attribute_names, from_attributes, from_structured, is_structured
from outrelay.transports.redis._client import open_client
from outrelay.transports.redis._config import RedisConfig
from outrelay.transports.redis._errors import map_redis_errors

__all__ = ["RedisReader", "decode"]


# field name as the transport writes it (bytes from redis-py; str with decode_responses) -> (name, attribute or "")
_FIELDS: dict[Any, tuple[str, str]] = {}
for _name, _attr in [*attribute_names("ce_").items(), ("content-type", ""), ("data", "")]:
    _FIELDS[_name] = _FIELDS[_name.encode()] = (_name, _attr)


def decode(key: str, fields: Mapping[Any, Any]) -> Received:
    """Rebuild a :class:`Received` from one stream entry (binary or structured mode).

    ``headers`` holds every field but ``data`` (values decoded as UTF-8, invalid
    bytes replaced); ``body`` the raw ``data``.

    :raises EventError: the entry is not an outrelay CloudEvent.
    :raises UnicodeDecodeError: a field name is not UTF-8.
    """
    headers: dict[str, str] = {}
    attrs: dict[str, str] = {}
    body: Any = b""
    for k, v in fields.items():  # one pass: names and values decoded, attributes collected
        hit = _FIELDS.get(k)
        if hit is not None:
            name, attr = hit
        else:  # another spelling, an extension outrelay does not write, or a foreign field
            name = k.decode() if isinstance(k, bytes) else str(k)
            attr = name[3:].lower() if name[:3].lower() == "ce_" else ""
        if name == "data":
            body = v
            continue
        text = v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        headers[name] = text
        if attr:
            attrs[attr] = text
    if not isinstance(body, bytes):
        body = str(body).encode()
    ctype = headers.get("content-type")
    if is_structured(ctype):
        event = from_structured(body)
    else:
        if ctype and "datacontenttype" not in attrs:
            attrs["datacontenttype"] = ctype
        event = from_attributes(attrs, body)  # what from_binary(headers, prefix="ce_") does
    return Received(event, key, event.stream, headers, body, ctype)


class RedisReader(Reader):
    """See the module docstring."""

    def __init__(
        self,
        cfg: RedisConfig,
        key: str,
        *,
        group: str | None = None,
        consumer: str = "outrelay-reader",
        from_beginning: bool = False,
    ) -> None:
        self.cfg = cfg
        self.key = key
        self.group = group or f"outrelay-reader-{uuid.uuid4().hex[:12]}"
        self._own_group = group is None
        self.consumer = consumer
        self.from_beginning = from_beginning
        self._client: Any = None

    async def start(self) -> None:
        client, _ = await open_client(self.cfg, f"reader of {self.key}")
        try:
            with map_redis_errors(f"XGROUP CREATE {self.key}", f"reader of {self.key}"):
                try:
                    await client.xgroup_create(
                        self.key, self.group, id="0" if self.from_beginning else "$", mkstream=True
                    )
                except rx.ResponseError as exc:
                    if "BUSYGROUP" not in str(exc):  # an existing named group resumes where it was
                        raise
        except BaseException:
            await client.aclose()
            raise
        self._client = client

    async def read(self, count: int, timeout: float) -> list[Received]:
        client = self._client
        if client is None:
            return []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        with map_redis_errors(f"XREADGROUP {self.key}", f"reader of {self.key}"):
            while len(out) < count:
                left = deadline - loop.time()
                if left <= 0:
                    break
                block = max(1, int(min(left, 1.0) * 1000))
                reply = await client.xreadgroup(
                    self.group, self.consumer, {self.key: ">"}, count=count - len(out), block=block
                )
                ids = []
                for _key, entries in reply or ():
                    for entry_id, fields in entries:
                        ids.append(entry_id)
                        out.append(decode(self.key, fields))
                if ids:
                    await client.xack(self.key, self.group, *ids)
        return out

    async def stop(self) -> None:
        client, self._client = self._client, None
        if client is None:
            return
        try:
            if self._own_group:
                with map_redis_errors(f"XGROUP DESTROY {self.key}", f"reader of {self.key}"):
                    await client.xgroup_destroy(self.key, self.group)
        finally:
            await client.aclose()
