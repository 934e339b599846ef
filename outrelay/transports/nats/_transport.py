"""The ``nats`` transport: NATS JetStream with acks and server-side dedupe.

Each event becomes one JetStream message on ``subject`` (a Template) with

* ``Nats-Msg-Id`` = event id, so the stream's duplicate window drops a
  re-send; the ack's ``duplicate`` flag is reported as ``Delivered(duplicate=True)``
  — unless it names no stream sequence: a clustered stream (nats-server 2.9)
  records a message id when the leader *proposes* the message, and keeps it
  when the message is then refused at apply time (order guard, ``discard =
  new``), so a re-send is acked "duplicate" with sequence 0 although nothing
  was stored. Such an ack is RetryLater, and after it or any JetStream
  refusal the event is re-sent under a new message id (``<event id>.r<n>``)
  that the stale entry cannot shadow (a copy may then be stored twice: at
  least once). Whether a refusal is RetryLater or Rejected is
  ``_errors.classify``'s call: too large, wrong stream and other 4xx answers
  are permanent; a full ``discard = new`` stream and no responders retry;
* the CloudEvents binary headers of the NATS binding: every attribute as a
  ``ce-*`` header, ``ce-datacontenttype`` included, values percent-encoded
  (non-ASCII, space, ``"``, ``%``); ``Content-Type`` repeats the data's type
  for consumers that read it;
* ``Nats-Expected-Stream`` when ``expected_stream`` is set.

Publishing is pipelined on one connection, acks awaited together, through
:class:`~outrelay.transports.nats._acks.AckMux` (what ``js.publish_async``
does, without its nats-py 2.16 bug of turning every JetStream API error into
a timeout).

Per-stream order when pipelined: a batch's messages are written in batch
order on one connection and JetStream stores what one connection sends in
the order sent, so the events of a stream land in order without waiting for
each ack. What could break that is a *prefix* being lost while a later
message is not: NATS over TCP loses whole tails, never holes, except that
nats-py re-sends its unflushed buffer after a reconnect. The transport
therefore drops that buffer when the connection drops (the messages in it
time out and are retried in order) and publishes nothing while the client is
reconnecting. A message refused locally (too large, wildcard subject) stops
the later messages of its stream in the batch (reported RetryLater, not
sent). The one case left is the server refusing message *k* of a stream
while accepting *k+1* already on the wire: in a cluster, a stream leader
change between the two; with ``discard=new`` limits, room appearing between
them. ``pipeline = "auto"`` (the default) therefore pipelines only where that
cannot happen — a stream that is neither replicated nor ``discard=new``, one
that takes each batch as an atomic batch (``atomic``, nats-server 2.12+,
:mod:`~outrelay.transports.nats._atomic`: stored whole or not at all), or
one the order guard protects — and elsewhere waits for each ack before
publishing a stream's next message (``pipeline = false``: streams still go in
parallel, one unacked message each, so even that case cannot reorder; a
stream's next message is written as soon as its previous one is acked,
with whatever other streams' messages are due in the same write,
:func:`~outrelay.kit.send_chained`). When the stream is unknown
at open (a templated subject, no ``expected_stream``) ``auto`` pipelines.
The order guard (``order_guard``, :mod:`~outrelay.transports.nats._chain`;
experimental, off by default, and refused on replicated streams: on
nats-server 2.9 their replicas can drop messages after refusals, on 2.14 a
refusal stopped the stream's acks) chains each message to the previous one
with ``Nats-Expected-Last-Msg-Id`` so the server refuses *k+1* when *k* was
not stored (RetryLater, retried in order). ``pipeline = true`` without the
guard reports both outcomes as they are and logs the break in order as a
warning.

No responders (no stream for the subject, JetStream not ready), timeouts and
connection loss are retryable (one table: ``_errors.ERRORS``). The lifecycle
is the kit's (:class:`~outrelay.kit.LifecycleTransport`): the client
reconnects by itself, and its disconnected/reconnected callbacks call
``connection_lost``/``connection_restored``, so while it reconnects ``send()``
raises RetryableError at once. When the client gives up (its closed
callback, for a client this transport did not close itself) the transport
counts as open again and the next send starts over: it closes and opens
once for all concurrent senders. ``check()`` opens with ``checking`` set, so
``create_stream`` creates nothing then. ``native_dedupe`` and its
window are declared once the stream's duplicate window is known (read from
stream info at open, or from ``create_stream``); until then they are not.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import nats
import nats.js.errors
from nats.aio.client import Client
from nats.js.client import JetStreamContext

from outrelay.kit import (
    Capabilities,
    Delivered,
    LifecycleTransport,
    Message,
    PermanentError,
    Reader,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    SubscriptionBackend,
    SubscriptionSpec,
    UsageError,
    send_chained,
    send_ordered,
)
from outrelay.transports.nats._acks import AckMux
from outrelay.transports.nats._atomic import send_atomic
from outrelay.transports.nats._chain import WRONG_LAST_MSG_ID, Chain, server_last_id, server_version
from outrelay.transports.nats._check import check
from outrelay.transports.nats._client import Callbacks, close_quietly, connect, drop_unsent, ensure_stream
from outrelay.transports.nats._config import NatsConfig, StreamSpec, atomic_not_allowed, publish_mode, stream_traits
from outrelay.transports.nats._errors import ERRORS, classify, mapped, result_for
from outrelay.transports.nats._group import NatsGroup
from outrelay.transports.nats._reader import NatsReader
from outrelay.transports.nats._subscription import NatsFanout
from outrelay.transports.nats._wire import encode_headers, invalid_subject

__all__ = ["NatsConfig", "NatsTransport", "StreamSpec", "connect", "drop_unsent"]

log = logging.getLogger("outrelay.transports.nats")


_REISSUE_LIMIT = 100_000  # event ids remembered for re-issuing (a few MB at most)
_PHANTOM = (
    "the stream acked a re-send as a duplicate of a message it never stored (sequence 0: its id was staged "
    "by a refused publish); re-sent under a new message id"
)


def _delivered(ack: dict[str, Any]) -> bool:
    """An ack that proves the message is stored: not a "duplicate" of sequence 0 (see the module docstring)."""
    return not ack.get("duplicate") or bool(ack.get("seq"))


class NatsTransport(LifecycleTransport[NatsConfig]):
    """See the module docstring."""

    name = "nats"
    Config = NatsConfig
    errors = ERRORS
    target_option = "subject"
    target_segment = "subject"

    def __init__(self, config: NatsConfig, *, destination: str = "nats") -> None:
        super().__init__(config, destination=destination)
        self._nc: Client | None = None
        self._acks: AckMux | None = None
        self._denied: list[str] = []  # subjects the server refused a publish to (for check)
        self._start_over = asyncio.Lock()  # one reconnect for all senders after the client gave up
        self._max_bytes = config.max_message_bytes
        spec = config.create_stream
        self._dedupe_window: float | None = spec.duplicate_window if spec else None
        self._chain: Chain | None = None  # the order guard (see _chain.py), decided at open
        self._pipelined = config.pipeline is not False  # decided at open (``pipeline = "auto"``)
        self._atomic = False  # atomic batches (``atomic``, see _atomic.py), decided at open
        self._inflight: dict[str, tuple[int, asyncio.Future[dict[str, Any]]]] = {}  # guarded, by msg id
        #: event id -> how many times it was re-issued under a new message id (see the module docstring)
        self._reissued: dict[str, int] = {}

    @property
    def capabilities(self) -> Capabilities:
        window = self._dedupe_window
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=True,
            native_dedupe=bool(window),
            dedupe_window=window or None,
            max_batch_count=1000,
            max_message_bytes=self._max_bytes,
            cloudevents_modes=("binary",),
            reader=True,
            subscriptions=True,
        )

    @property
    def pipelined(self) -> bool:
        """Whether sends pipeline a stream's messages (``pipeline``, as decided at the last open)."""
        return self._pipelined

    @property
    def atomic(self) -> bool:
        """Whether sends publish each batch as one JetStream atomic batch (``atomic``, as decided at the
        last open; off again if the stream stopped allowing it)."""
        return self._atomic

    @property
    def guarded(self) -> bool:
        """Whether the order guard chains messages (``order_guard``, as decided at the last open)."""
        return self._chain is not None

    # -- lifecycle -----------------------------------------------------------

    async def _open(self) -> None:
        """Connect, create ``create_stream`` if missing (not when opened for a check, which creates
        nothing), read the stream's dedupe window and decide the publish mode.

        :raises RetryableError: no server reachable (bounded by connect_timeout).
        :raises PermanentError: refused credentials or certificate, or a stream that cannot take
            the configured mode (see :meth:`_read_stream_info`).
        """
        callbacks = Callbacks(
            on_denied=self._on_denied,
            on_lost=self.connection_lost,
            on_restored=self.connection_restored,
            on_closed=self._on_closed,
        )
        self._nc = nc = await connect(self.cfg, self.destination, callbacks)
        js = nc.jetstream(timeout=self.cfg.ack_timeout)
        if self.cfg.create_stream is not None and not self.checking:
            await ensure_stream(js, self.cfg.create_stream, self.destination)
        await self._read_stream_info(js, nc)
        acks = AckMux(nc)
        with mapped("cannot subscribe to the ack inbox", self.destination):
            await acks.start()
        # headers travel inside max_payload: keep room for them
        self._max_bytes = min(self.cfg.max_message_bytes, max(1, nc.max_payload - 16 * 1024))
        self._acks = acks

    async def _close(self) -> None:
        nc, self._nc, self._acks = self._nc, None, None
        await close_quietly(nc, self.destination)

    def _on_denied(self, subject: str) -> None:
        self._denied.append(subject)
        del self._denied[:-16]
        if self._acks is not None:
            self._acks.deny(subject)

    def _on_closed(self, nc: Client) -> None:
        """``nc`` closed for good: it gave up reconnecting (or someone closed it). Unless it is
        one we closed ourselves, the next send starts over (:meth:`_connected`); until then the
        transport counts as open, not reconnecting: nothing reconnects by itself any more."""
        if nc is self._nc:
            self.connection_restored()

    async def _connected(self) -> AckMux:
        """The ack mux of a live client. When the client closed for good, start over (close and
        open again), once for all concurrent senders.

        :raises RetryableError/PermanentError: opening again failed. :raises UsageError: the
            transport was closed meanwhile."""
        acks, nc = self._acks, self._nc
        if acks is not None and nc is not None and not nc.is_closed:
            return acks
        async with self._start_over:
            if self._acks is None or self._nc is None or self._nc.is_closed:
                log.info("destination %s: the NATS client gave up reconnecting; connecting again", self.destination)
                await self._close()
                try:
                    await self._open()
                except BaseException:
                    await self._close()  # what it half-opened; the next send tries again
                    raise
            if self.state == "closed":  # close() ran while we connected: release what we opened
                await self._close()
            if self._acks is None:
                raise UsageError(f"nats transport {self.destination!r} was closed")
            return self._acks

    async def _read_stream_info(self, js: JetStreamContext, nc: Client) -> None:
        """Learn the duplicate window of the stream we publish to, when it is knowable, and decide
        the order guard and pipelining (``order_guard``, ``pipeline``; a new chain on every open).

        :raises PermanentError: ``order_guard = "last-msg-id"`` on a replicated stream (see
            :mod:`._chain`: no nats-server we tested guards one safely).
        """
        name = self.cfg.expected_stream or (self.cfg.create_stream.name if self.cfg.create_stream else None)
        cfg = self.cfg
        guard = cfg.order_guard == "last-msg-id"
        traits = {"replicated": False, "refuses": False, "allows_atomic": False}  # until the stream is read
        known = False  # the stream's configuration was read
        try:
            if name is None and self._template is not None and self._template.is_static:
                name = await js.find_stream_name_by_subject(cfg.subject)
            if name is not None:
                info = await js.stream_info(name)
                self._dedupe_window = info.config.duplicate_window or None
                traits = stream_traits(info.config)
                known = True
        except (TimeoutError, nats.errors.Error) as exc:
            # not fatal: publishing reports a missing stream per message
            log.debug("destination %s: no stream info: %s", self.destination, classify(exc)[1])
        if guard and traits["replicated"]:
            version = ".".join(map(str, server_version(nc)))
            raise PermanentError(
                f'order_guard = "last-msg-id" is not supported on replicated stream {name!r} (nats-server {version}): '
                "on 2.9 its replicas can drop messages after the refusals the guard causes, and on 2.14 the stream "
                'acknowledged nothing more after the first refusal; remove order_guard (pipeline = "auto" keeps '
                "per-stream order on a cluster)",
                destination=self.destination,
            )
        if cfg.atomic is True and not traits["allows_atomic"]:
            if name is not None and not known:  # it may answer on the next attempt (a cluster electing)
                raise RetryableError(
                    f"atomic = true: cannot read the configuration of stream {name!r} to check that it allows "
                    "atomic batches",
                    destination=self.destination,
                )
            raise PermanentError(
                atomic_not_allowed(name or "(unknown: set expected_stream)"), destination=self.destination
            )
        mode = publish_mode(cfg, **traits)
        self._atomic, self._pipelined = mode.atomic, mode.pipelined
        # guarded implies a known stream: "auto" guards only a stream whose configuration was read, and an
        # explicit guard needs expected_stream or create_stream (NatsConfig)
        self._chain = Chain(name) if mode.guarded and name is not None else None
        self._inflight.clear()

    # -- publishing ----------------------------------------------------------

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        acks = await self._connected()
        # without the order guard a batch (or a round of send_chained) is staged and written as one
        # command; a guarded message is written as it is linked into its chain (see _write)
        flush = acks.flush if self._chain is None else None

        async def start(m: Message) -> asyncio.Future[dict[str, Any]] | SendResult:
            prepared = self._prepare(m)
            if not isinstance(prepared, dict):
                return prepared
            try:
                if flush is not None:
                    return acks.stage(m.target, m.event.data, prepared)
                return await self._write(acks, m, prepared)
            except (nats.errors.Error, OSError) as exc:
                return result_for(exc, m.target)

        timeout = self.cfg.ack_timeout

        async def chained(messages: Sequence[Message]) -> list[SendResult]:
            # one message in flight per stream: a later one never overtakes a lost or refused one
            return await send_chained(
                messages, start, self._ack_outcome, timeout=timeout, destination=self.destination, log=log, flush=flush
            )

        if self._atomic:
            return await send_atomic(
                batch,
                acks,
                self._prepare,
                chained,
                timeout=timeout,
                destination=self.destination,
                on_disabled=self._atomic_disabled,
            )
        # pipelined: publish in batch order without waiting, then collect every ack (see the module docstring)
        return await send_ordered(
            batch,
            start,
            self._ack_outcome,
            pipeline=self._pipelined,
            timeout=timeout,
            destination=self.destination,
            log=log,
            flush=flush,
        )

    def _atomic_disabled(self) -> None:
        self._atomic = False
        log.warning(
            "destination %s: the stream no longer allows atomic batches (allow_atomic was turned off); "
            "publishing one unacked message per stream until the transport reopens",
            self.destination,
        )
        self._pipelined = False

    def _prepare(self, m: Message) -> dict[str, str] | SendResult:
        """The headers of ``m``, or its result when it cannot be published at all."""
        size = len(m.event.data)
        if size > self._max_bytes:
            return Rejected(f"message of {size} bytes exceeds max_message_bytes={self._max_bytes}")
        invalid = invalid_subject(m.target)
        if invalid is not None:
            return Rejected(invalid)
        reissued = self._reissued.get(m.event.id)
        msg_id = m.event.id if reissued is None else f"{m.event.id}.r{reissued}"
        return encode_headers(m.event, msg_id, self.cfg.expected_stream)

    async def _write(self, acks: AckMux, m: Message, headers: dict[str, str]) -> asyncio.Future[dict[str, Any]]:
        """Publish ``m``; with the order guard, as the next link of the chain (see ``_chain.py``).

        :raises nats.errors.Error: the connection cannot take the message now (then it is no link).
        """
        chain = self._chain
        if chain is None:
            return await acks.publish(m.target, m.event.data, headers)
        msg_id = headers["Nats-Msg-Id"]
        headers["Nats-Expected-Stream"] = chain.stream  # a subject of another stream: refused, not a broken chain
        previous, generation = chain.link(msg_id)  # no await between linking and writing
        if previous is not None:
            headers["Nats-Expected-Last-Msg-Id"] = previous
        try:
            future = await acks.publish(m.target, m.event.data, headers)
        except BaseException:
            chain.unlink(msg_id, previous, generation)
            raise
        self._inflight[msg_id] = (generation, future)
        future.add_done_callback(lambda f: self._on_guarded_ack(chain, generation, msg_id, f))
        return future

    def _on_guarded_ack(
        self, chain: Chain, generation: int, msg_id: str, future: asyncio.Future[dict[str, Any]]
    ) -> None:
        """A chained message's outcome: on a refusal for a broken chain, restart it from the
        server's last id and fail at once the earlier messages the refusal proves lost."""
        try:
            if future.cancelled() or not isinstance(future.exception(), nats.js.errors.APIError):
                return
            error = future.exception()
            assert isinstance(error, nats.js.errors.APIError)
            last = server_last_id(error.description) if error.err_code == WRONG_LAST_MSG_ID else None
            if last is None or not chain.broken(generation, last):
                return
            lost = self._lost_before(generation, msg_id, last)
            log.info(
                "destination %s: stream %s refused event %s: its last stored message is %s, not the previous one "
                "sent (%d earlier messages lost, e.g. in a leader change); the order guard holds back what followed, "
                "and the relay retries it in order",
                self.destination,
                chain.stream,
                msg_id,
                last or "(none)",
                lost,
            )
        finally:
            entry = self._inflight.get(msg_id)
            if entry is not None and entry[1] is future:
                del self._inflight[msg_id]

    def _lost_before(self, generation: int, msg_id: str, last: str) -> int:
        """Fail the messages written after ``last`` and before ``msg_id`` that still wait for an ack:
        the stream applied ``msg_id`` right after ``last``, so it will never store them (their
        chain is broken). Returns how many."""
        ids = list(self._inflight)
        end = ids.index(msg_id) if msg_id in ids else 0
        begin = ids.index(last) + 1 if last in ids[:end] else 0
        lost = 0
        for mid in ids[begin:end]:
            gen, pending = self._inflight[mid]
            if gen == generation and not pending.done():
                pending.set_exception(
                    nats.js.errors.APIError(
                        code=503,
                        description=f"not stored: the stream applied a later message after {last or 'none'} "
                        "(stream leader change?)",
                    )
                )
                lost += 1
        return lost

    def _ack_outcome(self, m: Message, ack: asyncio.Future[dict[str, Any]]) -> SendResult:
        if ack.cancelled():  # no ack within ack_timeout
            return result_for(TimeoutError(), m.target)
        error = ack.exception()
        if error is not None:
            return self._failed(m, error)
        return self._acked(m, ack.result())

    def _acked(self, m: Message, ack: dict[str, Any]) -> SendResult:
        if not _delivered(ack):
            self._reissue(m.event.id)
            return RetryLater(_PHANTOM)
        self._reissued.pop(m.event.id, None)
        return Delivered(duplicate=bool(ack.get("duplicate")))

    def _failed(self, m: Message, exc: BaseException) -> SendResult:
        if isinstance(exc, nats.js.errors.APIError):  # refused, so its staged message id must not shadow a re-send
            self._reissue(m.event.id)
        return result_for(exc, m.target)

    def _reissue(self, event_id: str) -> None:
        self._reissued[event_id] = self._reissued.pop(event_id, 0) + 1
        while len(self._reissued) > _REISSUE_LIMIT:  # forget the oldest (dicts keep insertion order)
            del self._reissued[next(iter(self._reissued))]

    # -- probes --------------------------------------------------------------

    async def _check(self) -> str:
        """Reachability, a stream bound to the subject, and publish permission (see :mod:`._check`);
        with ``create_stream``, a missing stream is reported as one the relay will create (check
        creates nothing: :meth:`_open` skips it while :attr:`checking`).

        :raises RetryableError: unreachable, or no answer in time.
        :raises PermanentError: no stream, the wrong stream, or publishing denied.
        """
        nc = self._nc
        if nc is None or nc.is_closed:
            raise RetryableError(f"nats transport {self.destination!r}: not connected", destination=self.destination)
        self._denied.clear()
        probe = self.check_target("outrelay.check")
        return await check(self.cfg, self.destination, nc, probe, self._denied)

    def reader(self, target: str, **options: Any) -> Reader:
        return NatsReader(self.cfg, target, destination=self.destination, **options)

    def subscription(self, spec: SubscriptionSpec) -> SubscriptionBackend:
        """A JetStream consumer group or fan-out (see :mod:`outrelay.transports.nats._subscription`).

        :raises PermanentError: ``spec.target`` is empty and ``subject`` renders no NATS pattern.
        """
        if spec.group is None:
            return NatsFanout(self.cfg, self.destination, spec)
        return NatsGroup(self.cfg, self.destination, spec)
