"""The consuming state of a rabbitmq subscription: one connection (:class:`Link`) and its lanes.

A :class:`Lane` is one consuming channel on one queue (the fan-out queue, a
group's single queue, or one shard queue of a group). Delivery tags are per
channel, so an ack always goes to the lane that delivered the message, and
never after that lane (or its link) was closed: the broker has requeued the
message by then, and the same tag on another channel names another message.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import aio_pika.abc
import aiormq.abc

__all__ = ["LOST", "Lane", "Link"]

LOST = None  # put in a link's inbox when its connection closes or a lane is cancelled: wakes a waiting receive


@dataclasses.dataclass(eq=False)
class Lane:
    """One consuming channel. ``outstanding`` counts messages handed to the runtime and not acked yet;
    while ``draining`` (being released to another member) new deliveries are ``held`` back."""

    queue: str
    channel: aio_pika.abc.AbstractChannel
    wire: aiormq.abc.AbstractChannel
    outstanding: int = 0
    draining: bool = False
    closed: bool = False
    held: list[aiormq.abc.DeliveredMessage] = dataclasses.field(default_factory=list)
    drained: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)


@dataclasses.dataclass(eq=False)
class Link:
    """One connection and everything delivered on it, in delivery order per lane."""

    conn: aio_pika.abc.AbstractConnection
    control: aio_pika.abc.AbstractChannel
    inbox: asyncio.Queue[tuple[Lane, aiormq.abc.DeliveredMessage] | None] = dataclasses.field(
        default_factory=asyncio.Queue
    )
    lanes: dict[str, Lane] = dataclasses.field(default_factory=dict)
    lost: str | None = None

    def lose(self, why: str) -> None:
        if self.lost is None:
            self.lost = why
            self.inbox.put_nowait(LOST)

    def on_close(self, _sender: Any, exc: BaseException | None = None) -> None:
        """Close callback of the connection and the control channel."""
        self.lose(type(exc).__name__ if exc is not None else "closed")

    async def consume(self, queue: str, prefetch: int, *, exclusive: bool = False) -> Lane:
        """Open a channel consuming ``queue`` with manual acks; the lane is registered once consuming.

        :raises aiormq.exceptions.ChannelAccessRefused: ``exclusive`` and another member consumes it.
        """
        channel = await self.conn.channel(publisher_confirms=False)
        try:
            await channel.set_qos(prefetch_count=prefetch)
            lane = Lane(queue, channel, await channel.get_underlay_channel())

            async def deliver(message: aiormq.abc.DeliveredMessage) -> None:
                self.inbox.put_nowait((lane, message))

            async def cancelled(_frame: Any) -> None:
                # basic.cancel from the broker: the queue was deleted; consuming again re-declares it
                lane.closed = True
                self.lose(f"the broker cancelled the consumer of {queue!r}: was the queue deleted?")

            lane.wire.on_consumer_cancel_callbacks.add(cancelled)
            await lane.wire.basic_consume(queue, deliver, no_ack=False, exclusive=exclusive)
        except BaseException:
            if not channel.is_closed:
                await channel.close()
            raise

        def closed(_sender: Any, exc: BaseException | None = None) -> None:
            if not lane.closed:  # not released by us: start over on a new connection
                lane.closed = True
                self.lose(f"channel of {queue!r} closed ({type(exc).__name__ if exc else 'by the broker'})")

        channel.close_callbacks.add(closed)
        self.lanes[queue] = lane
        return lane

    async def release(self, lane: Lane) -> None:
        """Close ``lane``'s channel: the broker requeues what it delivered and nobody acked."""
        lane.closed = True
        lane.held.clear()
        self.lanes.pop(lane.queue, None)
        if not lane.channel.is_closed:
            await lane.channel.close()
