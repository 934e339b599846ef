"""Publishing many messages on one aiormq confirm channel in one write.

aiormq's ``Channel.basic_publish`` does, for every message: a routing-key
check, a countdown and an ``asyncio.timeout`` scope, a channel-close guard
(an async context manager), the channel lock, a ``Basic.Publish`` and a
``ContentHeader`` object, pamqp's frame marshalling through a ``BytesIO``,
one put on the connection's write queue, and then the confirm. On the
relay's RabbitMQ path that was a large share of its CPU per event
(benchmarks/README.md, "Why the code is as it is"), and the transport needs
none of it per message: it sends a batch (with ``pipeline =
false``, each round of messages due, one per stream) and then waits for
their confirms.

:class:`Staged` collects messages encoded straight to their AMQP frames
(``Basic.Publish`` method frame, content header with the properties of
:mod:`~outrelay.transports.rabbitmq._wire`, body frames split at the
connection's ``frame_max``), each with a confirm future from the channel's
own future store (so a closing channel fails them, as it fails aiormq's
own), and :meth:`Staged.write` hands them to aiormq in one piece: under the
channel lock it puts one frame on the write queue and then registers the
delivery tags the broker will give them (one per message, counting on from
the channel's last) in ``channel.confirmations`` and the message ids in
``channel.message_id_delivery_tag`` — exactly the bookkeeping
``basic_publish`` does, which aiormq's reader then uses unchanged for acks,
nacks (``multiple`` included) and returned (``mandatory``) messages.
Registering only after the put succeeded, with no suspension in between,
means a put that fails or is cancelled leaves no tag behind, and no confirm
can arrive before its tag is known.

These are aiormq's public channel attributes (``lock``, ``delivery_tag``,
``confirmations``, ``message_id_delivery_tag``, ``write_queue``,
``number``, ``max_content_size``, ``create_future``); ``tests/transports/
test_rabbitmq_publish.py`` fails if one disappears and pins the bytes
against pamqp's and aiormq's own encoding.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from aiormq.abc import ChannelFrame

from outrelay.kit import failing_staged
from outrelay.transports.rabbitmq._wire import Properties

__all__ = ["Staged", "publish_frames"]

_FRAME = struct.Struct(">BHI")  # frame type, channel, payload size
_END = b"\xce"
_PUBLISH = struct.pack(">HHH", 60, 40, 0)  # class Basic, method Publish, reserved ticket
_HEADER = struct.Struct(">HHQ")  # class Basic, weight 0, body size
_BITS = (b"\x00", b"\x01")  # Basic.Publish bits: mandatory (immediate is never set)


def publish_frames(
    channel: int, exchange: str, routing_key: str, mandatory: bool, properties: bytes, body: bytes, max_content: int
) -> bytes:
    """The frames of one ``Basic.Publish`` with its content, as aiormq would write them.

    ``properties`` is a marshalled :class:`~outrelay.transports.rabbitmq._wire.Properties`;
    ``exchange`` and ``routing_key`` must already be valid (at most 255 bytes each, see
    :func:`~outrelay.transports.rabbitmq._config.bad_names`); ``max_content`` is the
    largest body frame payload (``frame_max`` minus the frame overhead).
    """
    name, key = exchange.encode(), routing_key.encode()
    method = b"%b%c%b%c%b%b" % (_PUBLISH, len(name), name, len(key), key, _BITS[mandatory])
    header = _HEADER.pack(60, 0, len(body)) + properties
    parts = [_FRAME.pack(1, channel, len(method)), method, _END, _FRAME.pack(2, channel, len(header)), header, _END]
    for lo in range(0, len(body), max_content):
        chunk = body[lo : lo + max_content]
        parts += (_FRAME.pack(3, channel, len(chunk)), chunk, _END)
    return b"".join(parts)


class Staged:
    """Messages encoded for one write on ``channel`` (an aiormq confirm channel); see the module docstring.

    :meth:`stage` as many as wanted (no I/O, nothing is sent), then :meth:`write` once;
    the object can then stage the next group.
    """

    __slots__ = ("_frames", "_ids", "_pending", "channel", "mandatory")

    def __init__(self, channel: Any, *, mandatory: bool) -> None:
        self.channel = channel
        self.mandatory = mandatory
        self._frames: list[bytes] = []
        self._ids: list[str] = []
        self._pending: list[asyncio.Future[Any]] = []

    def stage(self, body: bytes, properties: Properties, exchange: str, routing_key: str) -> asyncio.Future[Any]:
        """Encode one message; the future resolves with the broker's confirm once it is written.

        The future fails with ``PublishError`` when the broker returns the message
        (``mandatory``), ``DeliveryError`` when it nacks it, or the channel's close
        reason; it is cancelled if :meth:`write` could not send it.
        """
        ch = self.channel
        self._frames.append(
            publish_frames(ch.number, exchange, routing_key, self.mandatory, properties.marshal(), body,
                           ch.max_content_size)
        )  # fmt: skip
        self._ids.append(properties.message_id or "")
        future: asyncio.Future[Any] = ch.create_future()
        self._pending.append(future)
        return future

    async def write(self) -> None:
        """Send what was staged, in staging order, in one piece; then forget it.

        On any failure nothing staged was sent: every staged future gets the
        exception (cancelled, if the write itself was cancelled) and it is raised.
        """
        frames, ids, pending = self._frames, self._ids, self._pending
        self._frames, self._ids, self._pending = [], [], []
        if not pending:
            return
        ch = self.channel
        with failing_staged(pending):
            async with ch.lock:  # raises ChannelInvalidStateError once the channel is closed
                await ch.write_queue.put(ChannelFrame(payload=b"".join(frames), should_close=False))
                # the broker numbers a channel's publishes 1, 2, ... in the order it reads them; nothing
                # else publishes on this channel outside its lock, and nothing runs between here and the put
                tag = ch.delivery_tag
                confirmations, by_id = ch.confirmations, ch.message_id_delivery_tag
                for message_id, future in zip(ids, pending, strict=True):
                    tag += 1
                    confirmations[tag] = future
                    by_id[message_id] = tag
                    future.add_done_callback(_Forget(by_id, message_id, tag))
                ch.delivery_tag = tag


class _Forget:
    """Drops a confirmed message's id from the channel's return map (what aiormq's own
    ``forget_message_id`` does), unless a later publish reused the id."""

    __slots__ = ("by_id", "message_id", "tag")

    def __init__(self, by_id: dict[str, int], message_id: str, tag: int) -> None:
        self.by_id, self.message_id, self.tag = by_id, message_id, tag

    def __call__(self, _: asyncio.Future[Any]) -> None:
        if self.by_id.get(self.message_id) == self.tag:
            del self.by_id[self.message_id]
