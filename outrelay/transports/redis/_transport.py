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

import asyncio
import contextlib
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from redis.asyncio.cluster import RedisCluster

from outrelay.kit import (
    Capabilities,
    Delivered,
    LifecycleTransport,
    Message,
    PermanentError,
    Progress,
    Reader,
    Rejected,
    RetryLater,
    SendResult,
    SubscriptionBackend,
    SubscriptionSpec,
    Template,
    TransportError,
    current_progress,
    deferred,
)
from outrelay.transports.redis._batch import HELD, XADD_SCRIPT, Entry, send_scripted, send_waves
from outrelay.transports.redis._client import Client, connect, open_client
from outrelay.transports.redis._config import RedisConfig
from outrelay.transports.redis._direct import DirectScript
from outrelay.transports.redis._errors import ERRORS, describe, map_redis_errors
from outrelay.transports.redis._group import RedisGroup
from outrelay.transports.redis._reader import RedisReader
from outrelay.transports.redis._slots import send_slotted
from outrelay.transports.redis._subscriber import RedisFanout
from outrelay.transports.redis._wire import encode

__all__ = ["RedisConfig", "RedisTransport", "connect", "encode"]

IDMP_VERSION = (8, 6)
CHUNK_BYTES = 4 * 1024 * 1024  # per script call / pipeline: bounds memory and the server's time in one script


def _version(info: dict[str, Any]) -> tuple[int, ...]:
    raw = str(info.get("redis_version", "0"))
    return tuple(int(p) for p in raw.split(".")[:3] if p.isdigit())


def _chunks(batch: Sequence[Message], limit: int, results: list[SendResult | None]) -> list[list[int]]:
    """Indexes into ``batch`` in chunks of about :data:`CHUNK_BYTES`; a message over ``limit`` bytes
    is Rejected in ``results`` and the later ones of its stream are held back there."""
    failed: set[str] = set()
    chunks: list[list[int]] = [[]]
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
    return chunks


class RedisTransport(LifecycleTransport[RedisConfig]):
    """See the module docstring (open/close rules: :class:`~outrelay.kit.LifecycleTransport`)."""

    name = "redis"
    Config = RedisConfig
    errors = ERRORS
    target_option = "stream"
    target_segment = "key"
    #: what the conformance suite cannot certify here, and why (see outrelay.conformance.ConformanceTarget)
    conformance_unsupported: ClassVar[Mapping[str, str]] = {
        "throttle": "Redis has no throttling answer (a full server refuses with OOM, no retry hint)",
    }
    #: the reader that sees what was appended before it started (the durability check)
    conformance_late_reader_options: ClassVar[Mapping[str, Any] | None] = {"from_beginning": True}

    def __init__(self, config: RedisConfig, *, destination: str = "redis") -> None:
        super().__init__(config, destination=destination)
        self._client: Client | None = None
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

    @property
    def _where(self) -> str:
        return f"cluster {self.cfg.url}" if self.cfg.cluster else self.cfg.url

    async def _open(self) -> None:
        client, info = await open_client(self.cfg, self.destination)
        self.server_version = _version(info)
        self._idmp = self.cfg.dedupe == "auto" and self.server_version >= IDMP_VERSION
        self._client = client
        if self.cfg.batching != "script":
            self._script = None
        elif isinstance(client, RedisCluster):  # send_slotted routes each slot's EVALSHA by the script's sha
            self._script = client.register_script(XADD_SCRIPT)
        else:  # standalone: EVALSHA on connections of its own (see _direct)
            self._script = DirectScript(client, XADD_SCRIPT)

    async def _close(self) -> None:
        client, self._client = self._client, None
        if isinstance(self._script, DirectScript):
            await self._script.close()
        if client is not None:
            with contextlib.suppress(Exception):  # closing: nothing useful to report to the caller
                await client.aclose()

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        """Chunk by chunk (see :data:`CHUNK_BYTES`): each chunk's outcomes are recorded in the send's
        progress as soon as its reply arrives, and the next chunk starts only if ``may_start`` allows
        it (else its messages are :func:`~outrelay.kit.deferred`, NotSent)."""
        client = self._client
        assert client is not None  # open
        progress = current_progress()
        results: list[SendResult | None] = [None] * len(batch)
        chunks = _chunks(batch, self.cfg.max_message_bytes, results)
        progress.record(batch, results)  # refused locally: known before anything is sent
        failed: set[str] = set()  # streams whose XADD failed: later chunks hold their events
        loop = asyncio.get_running_loop()
        latency = 0.0  # of the last chunk: what the next one is expected to take
        for c, chunk in enumerate(chunks):
            if c and not progress.may_start(expected=latency):
                self._settle(batch, chunks[c:], results, deferred(progress), progress)
                break
            todo = self._todo(batch, chunk, failed, results)
            if not todo:
                continue
            started = loop.time()
            try:
                with map_redis_errors(f"XADD to {self._where}", self.destination):
                    outcomes = await self._send_chunk(client, [batch[i] for i in todo])
            except TransportError as exc:
                if c == 0:
                    raise  # nothing went out: the whole batch failed
                outcome: SendResult = Rejected(str(exc)) if isinstance(exc, PermanentError) else RetryLater(str(exc))
                self._settle(batch, chunks[c:], results, outcome, progress)
                break
            latency = loop.time() - started
            for i, result in zip(todo, outcomes, strict=True):
                results[i] = result
                progress.report(batch[i], result)
                if not isinstance(result, Delivered):
                    failed.add(batch[i].key)
        return [r if r is not None else RetryLater("no outcome recorded") for r in results]

    @staticmethod
    def _todo(
        batch: Sequence[Message], chunk: list[int], failed: set[str], results: list[SendResult | None]
    ) -> list[int]:
        """The messages of ``chunk`` to send: those of a stream that failed earlier are held back."""
        todo: list[int] = []
        for i in chunk:
            if batch[i].key in failed:
                results[i] = RetryLater(HELD)
            else:
                todo.append(i)
        return todo

    @staticmethod
    def _settle(
        batch: Sequence[Message],
        chunks: list[list[int]],
        results: list[SendResult | None],
        outcome: SendResult,
        progress: Progress,
    ) -> None:
        """``outcome`` for every message of ``chunks`` without one yet (a chunk failed or was not started)."""
        for chunk in chunks:
            for i in chunk:
                if results[i] is None:
                    results[i] = outcome
                    progress.report(batch[i], outcome)

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
                progress=current_progress(),
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
        return await send_waves(client, entries, messages, current_progress())

    async def _check(self) -> str:
        """PING, server version, and for a static key: that it is a stream (or absent)
        and, where ``ACL DRYRUN`` is allowed, that this user may XADD to it."""
        client = self._client
        assert client is not None  # open
        version = ".".join(map(str, self.server_version or ()))
        nodes = f"{len(client.get_primaries())} primaries, " if isinstance(client, RedisCluster) else ""
        head = f"redis {self._where} reachable ({nodes}Redis {version}, dedupe {'IDMP' if self._idmp else 'none'})"
        if self._template is not None and not self._template.is_static:  # the kit's, from target_option
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

    # -- conformance runner hooks (see outrelay.conformance.runner) ------------------------------------------

    async def conformance_cleanup(self) -> None:
        """Delete the configured ``stream`` key and its consumer groups' gate lists (``<key>:gate:*``):
        what the conformance runner's checks left on their per-check key. A template: nothing."""
        client = self._client
        if client is None or self._template is None or not self._template.is_static:
            return
        key = self.cfg.stream
        pattern = re.sub(r"([*?\[\]\\])", r"\\\1", key) + ":gate:*"  # the key itself matched literally
        with map_redis_errors(f"DEL {key}", self.destination):
            doomed = [key, *[k async for k in client.scan_iter(match=pattern, count=1000)]]
            for k in doomed:  # one key per call: on a cluster a multi-key DEL must not cross slots
                await client.delete(k)

    async def conformance_publish_foreign(self) -> None:
        """Append an entry that is not an outrelay CloudEvent (no ``ce_*`` fields) to the configured key."""
        client = self._client
        assert client is not None  # the runner opens the transport first
        with map_redis_errors(f"XADD {self.cfg.stream}", self.destination):
            await client.xadd(self.cfg.stream, {"hello": b"world"})

    def reader(self, target: str, **options: Any) -> Reader:
        """A consumer-group reader of ``target`` (options: ``group``, ``consumer``, ``from_beginning``)."""
        return RedisReader(self.cfg, target, **options)

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A consumer-group (:class:`~._group.RedisGroup`) or fan-out (:class:`~._subscriber.RedisFanout`)
        backend of ``spec.target`` (``""``: the fixed ``stream`` key); see :mod:`._subscriber`.

        :raises PermanentError: ``spec.target`` is empty and ``stream`` is a template.
        """
        key = spec.target
        if not key:
            if not Template(self.cfg.stream, where=f"destinations.{self.destination}.stream").is_static:
                raise PermanentError(
                    f"destinations.{self.destination}.stream = {self.cfg.stream!r} is a template and Redis cannot "
                    "consume a key pattern: subscribe with an explicit target (one rendered key) or set a fixed "
                    "stream key",
                    destination=self.destination,
                )
            key = self.cfg.stream
        if spec.group is None:
            return RedisFanout(self.cfg, spec, key, destination=self.destination)
        return RedisGroup(self.cfg, spec, key, destination=self.destination)
