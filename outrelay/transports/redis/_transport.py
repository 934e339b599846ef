"""The ``redis`` transport: Redis Streams via redis-py asyncio.

Each event is one ``XADD`` entry on the key rendered from the ``stream``
template. Binary mode (default) stores the CloudEvents attributes as
``ce_*`` fields, ``content-type`` and the raw ``data``; structured mode
stores ``content-type: application/cloudevents+json`` and the JSON event as
``data``. ``maxlen`` adds ``MAXLEN ~`` trimming.

Sending: by default one ``EVALSHA`` of a small Lua script appends the whole
batch atomically and in order, skipping the later events of a stream once
one of its XADDs failed; ``batching = "pipeline"`` uses pipelined waves
instead (no scripting permission needed). Both keep ``ordered_batches``
honest; see :mod:`outrelay.transports.redis._batch`.

Subscriptions (consumer groups with a per-stream gate, and fan-out) are in
:mod:`outrelay.transports.redis._subscriber`.

Dedupe: on Redis >= 8.6 (detected at open) ``XADD ... IDMP producer_id
event_id`` makes a re-sent event a no-op and ``native_dedupe`` is declared;
on older servers there is no native dedupe. Capabilities are therefore only
final after :meth:`open`.

Redis Cluster (``cluster = true``, ``url`` = any node): redis-py's cluster
client (:mod:`._client`) sends each key's commands to its slot's primary and
follows ``MOVED``/``ASK`` through resharding and failovers. Per-stream order
needs a stream's entries on one key (the template renders one key per
stream, e.g. ``events:{stream}``, or one key for all); keys may be spread
over every slot. A script call may only touch one slot, so the script path
sends one call per slot, all slots of a chunk in one pipeline
(:mod:`._slots`); the pipeline path needs nothing special (each wave holds one
XADD per stream). A relay re-sends what a failover or a redirection left
unanswered: at least once, never out of order.

:raises RetryableError: from ``open`` when the server is unreachable within
    ``connect_timeout``; PermanentError when authentication fails or the
    server is a cluster node under ``cluster = false`` (or standalone under
    ``cluster = true``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from redis.asyncio.cluster import RedisCluster

from outrelay.kit import (
    STRUCTURED_CONTENT_TYPE,
    Capabilities,
    Delivered,
    Event,
    Message,
    PermanentError,
    Reader,
    Rejected,
    RetryLater,
    SendResult,
    Template,
    Transport,
    TransportError,
    UsageError,
    binary_headers,
    to_structured,
)
from outrelay.transports.redis._batch import HELD, XADD_SCRIPT, Entry, send_pipelined, send_scripted
from outrelay.transports.redis._client import Client, connect, open_client
from outrelay.transports.redis._config import RedisConfig
from outrelay.transports.redis._errors import describe, map_redis_errors
from outrelay.transports.redis._slots import send_slotted

if TYPE_CHECKING:
    from outrelay.kit import SubscriptionBackend, SubscriptionSpec

__all__ = ["RedisConfig", "RedisTransport", "connect", "encode"]

IDMP_VERSION = (8, 6)
CHUNK_BYTES = 4 * 1024 * 1024  # per script call / pipeline: bounds memory and the server's time in one script


def encode(event: Event, mode: str) -> dict[str, str | bytes]:
    """The XADD fields of ``event`` in binary or structured mode."""
    if mode == "structured":
        return {"content-type": STRUCTURED_CONTENT_TYPE, "data": to_structured(event)}
    fields: dict[str, str | bytes] = dict(binary_headers(event, "ce_"))
    if event.content_type:
        fields["content-type"] = event.content_type
    fields["data"] = event.data
    return fields


def _version(info: dict[str, Any]) -> tuple[int, ...]:
    raw = str(info.get("redis_version", "0"))
    return tuple(int(p) for p in raw.split(".")[:3] if p.isdigit())


class RedisTransport(Transport):
    """See the module docstring."""

    name = "redis"
    Config = RedisConfig

    def __init__(self, config: RedisConfig, *, destination: str = "redis") -> None:
        super().__init__(config, destination=destination)
        self.cfg: RedisConfig = config
        self._template = Template(config.stream, where=f"destinations.{destination}.stream", segment="key")
        self._client: Client | None = None
        self._state = "new"
        self.server_version: tuple[int, ...] | None = None
        self._idmp = False
        self._script: Any = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=True,
            native_dedupe=self._idmp,
            dedupe_window=self.cfg.dedupe_window if self._idmp else None,
            max_batch_count=1000,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary", "structured"),
            reader=True,
            subscriptions=True,
        )

    def target(self, event: Event) -> str:
        return self._template.render(event)

    @property
    def _where(self) -> str:
        return f"cluster {self.cfg.url}" if self.cfg.cluster else self.cfg.url

    async def open(self) -> None:
        if self._state == "open":
            return
        client, info = await open_client(self.cfg, self.destination)
        self.server_version = _version(info)
        self._idmp = self.cfg.dedupe == "auto" and self.server_version >= IDMP_VERSION
        self._client = client
        self._script = client.register_script(XADD_SCRIPT) if self.cfg.batching == "script" else None
        self._state = "open"

    async def close(self) -> None:
        client, self._client = self._client, None
        if self._state == "open":
            self._state = "closed"
        if client is not None:
            with contextlib.suppress(Exception):  # closing: nothing useful to report to the caller
                await client.aclose()

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        client = self._client
        if self._state != "open" or client is None:
            raise UsageError(f"redis transport {self.destination!r} is {self._state}, not open")
        results: list[SendResult | None] = [None] * len(batch)
        failed: set[str] = set()
        limit = self.cfg.max_message_bytes
        chunks: list[list[int]] = [[]]  # indexes into batch
        size = 0
        for i, m in enumerate(batch):
            if m.key in failed:
                results[i] = RetryLater(HELD)
                continue
            n = len(m.event.data)
            if n > limit:
                results[i] = Rejected(f"message of {n} bytes exceeds max_message_bytes={limit}")
                failed.add(m.key)  # its later events are held in this loop
                continue
            size += n + 1024
            if size > CHUNK_BYTES and chunks[-1]:  # keep one command (and the server's script time) bounded
                chunks.append([])
                size = n + 1024
            chunks[-1].append(i)
        failed = set()  # from here on: streams whose XADD failed (later chunks hold their events)
        for c, chunk in enumerate(chunks):
            todo: list[int] = []
            for i in chunk:
                if batch[i].key in failed:
                    results[i] = RetryLater(HELD)
                else:
                    todo.append(i)
            if not todo:
                continue
            try:
                with map_redis_errors(f"XADD to {self._where}", self.destination):
                    outcomes = await self._send_chunk(client, [batch[i] for i in todo])
            except TransportError as exc:
                if c == 0:
                    raise  # nothing went out: the whole batch failed
                outcome: SendResult = Rejected(str(exc)) if isinstance(exc, PermanentError) else RetryLater(str(exc))
                for later in chunks[c:]:
                    for i in later:
                        results[i] = results[i] or outcome
                break
            for i, outcome in zip(todo, outcomes, strict=True):
                results[i] = outcome
                if not isinstance(outcome, Delivered):
                    failed.add(batch[i].key)
        return [r if r is not None else RetryLater("no outcome recorded") for r in results]

    async def _send_chunk(self, client: Client, messages: list[Message]) -> list[SendResult]:
        """One script call (on a cluster: one per slot) or one series of pipelined waves for ``messages``."""
        head = [] if self.cfg.maxlen is None else ["MAXLEN", "~", str(self.cfg.maxlen)]
        producer_id = self.cfg.producer_id if self._idmp else None
        if self._script is not None and self.cfg.cluster:
            assert isinstance(client, RedisCluster)
            return await send_slotted(
                client,
                messages,
                sha=self._script.sha,
                mode=self.cfg.mode,
                producer_id=producer_id,
                head=head,
                where=self._where,
                destination=self.destination,
            )
        if self._script is not None:
            return await send_scripted(self._script, messages, mode=self.cfg.mode, producer_id=producer_id, head=head)
        entries = [
            Entry(
                m.key,
                m.target,
                head if producer_id is None else ["IDMP", producer_id, m.event.id, *head],
                encode(m.event, self.cfg.mode),
            )
            for m in messages
        ]
        return await send_pipelined(client, entries)

    async def check(self) -> str:
        """PING, server version, and for a static key: that it is a stream (or absent)
        and, where ``ACL DRYRUN`` is allowed, that this user may XADD to it."""
        opened_here = self._state != "open"
        await self.open()
        assert self._client is not None
        client = self._client
        try:
            version = ".".join(map(str, self.server_version or ()))
            nodes = f"{len(client.get_primaries())} primaries, " if isinstance(client, RedisCluster) else ""
            head = f"redis {self._where} reachable ({nodes}Redis {version}, dedupe {'IDMP' if self._idmp else 'none'})"
            if not self._template.is_static:
                return f"{head}; keys from template {self.cfg.stream!r} are resolved at publish"
            key = self.cfg.stream
            with map_redis_errors(f"TYPE {key}", self.destination):
                kind = await client.type(key)
            kind = kind.decode() if isinstance(kind, bytes) else str(kind)
            if kind not in ("none", "stream"):
                raise PermanentError(
                    f"redis key {key!r} holds a {kind}, not a stream: delete it or choose another `stream`",
                    destination=self.destination,
                )
            permission = await self._dryrun(client, key)
            return f"{head}; stream {key!r} {'exists' if kind == 'stream' else 'will be created'}; {permission}"
        finally:
            if opened_here:
                await self.close()
                self._state = "new"

    async def _dryrun(self, client: Client, key: str) -> str:
        commands: list[tuple[str, ...]] = [("XADD", key, "*", "f", "v")]
        if self._script is not None:
            commands.append(("EVALSHA", self._script.sha, "1", key, "0"))
        try:
            raw_user = await client.acl_whoami()
            user = raw_user.decode() if isinstance(raw_user, bytes) else str(raw_user)
            replies = [await client.acl_dryrun(user, *command) for command in commands]
        except Exception as exc:  # DRYRUN itself may be forbidden or unknown (Redis < 7)
            return f"publish permission not verified ({describe(exc)[:60]})"
        for command, reply in zip(commands, replies, strict=True):
            text = reply.decode() if isinstance(reply, bytes) else str(reply)
            if text != "OK":
                fix = "+xadd on the key pattern" if command[0] == "XADD" else '+evalsha +eval, or batching = "pipeline"'
                raise PermanentError(
                    f"redis user {user!r} may not {command[0]} on {key!r}: {text} (grant {fix})",
                    destination=self.destination,
                )
        return f"user {user!r} may {' and '.join(c[0] for c in commands)}"

    def reader(self, target: str, **options: Any) -> Reader:
        """A consumer-group reader of ``target`` (options: ``group``, ``consumer``, ``from_beginning``)."""
        from outrelay.transports.redis._reader import RedisReader

        return RedisReader(self.cfg, target, **options)

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A consumer-group or fan-out backend of ``spec.target`` (``""``: the fixed ``stream`` key);
        see :mod:`outrelay.transports.redis._subscriber`.

        :raises PermanentError: ``spec.target`` is empty and ``stream`` is a template.
        """
        from outrelay.transports.redis._subscriber import subscription

        return subscription(self.cfg, spec, destination=self.destination)
