"""The consumer side of the ``mqtt`` transport (the conformance suite reads back through it).

A reader is its own MQTT connection subscribed to one topic with QoS 1;
:meth:`MqttReader.start` returns after SUBACK, so it sees what is published
afterwards. Each message is decoded with the CloudEvents MQTT binding (user
properties without prefix, Content Type); a message that is not a CloudEvent
is skipped with a debug log line. ``Received.key`` is the ``partitionkey``
attribute: MQTT has no ordering key of its own, and the binding carries the
event's stream there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING

import paho.mqtt.client as mqtt

from outrelay.kit import EventError, Reader, Received, from_binary

if TYPE_CHECKING:
    from outrelay_mqtt._client import Bridge
    from outrelay_mqtt._transport import MqttTransport

__all__ = ["MqttReader", "decode"]

log = logging.getLogger("outrelay.transports.mqtt")


def decode(msg: mqtt.MQTTMessage) -> Received | None:
    """The :class:`Received` of an MQTT message, or ``None`` if it is not a CloudEvent."""
    props = msg.properties
    headers: dict[str, str] = {}
    for k, v in getattr(props, "UserProperty", None) or []:
        headers[k] = v
    content_type = getattr(props, "ContentType", None)
    body = bytes(msg.payload)
    try:
        event = from_binary(headers, body, content_type=content_type, prefix="")
    except (EventError, ValueError) as exc:
        log.debug("mqtt reader: skipping a message on %r that is not a CloudEvent: %s", msg.topic, exc)
        return None
    return Received(event, msg.topic, headers.get("partitionkey"), headers, body, content_type)


class MqttReader(Reader):
    """Reads the CloudEvents published to one topic after :meth:`start`."""

    def __init__(self, transport: MqttTransport, topic: str) -> None:
        self._transport = transport
        self.topic = topic
        self._queue: asyncio.Queue[Received] = asyncio.Queue()
        self._bridge: Bridge | None = None

    def _on_message(self, msg: mqtt.MQTTMessage) -> None:
        r = decode(msg)
        if r is not None:
            self._queue.put_nowait(r)

    async def start(self) -> None:
        bridge = self._bridge = self._transport.bridge("reader", on_message=self._on_message)
        timeout = self._transport.cfg.connect_timeout + 1.0
        try:
            await bridge.start(timeout)
            await bridge.subscribe(self.topic, timeout)
        except BaseException:
            await self.stop()
            raise

    async def read(self, count: int, timeout: float) -> list[Received]:
        out: list[Received] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while len(out) < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                out.append(await asyncio.wait_for(self._queue.get(), left))
        return out

    async def stop(self) -> None:
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            await bridge.stop()
