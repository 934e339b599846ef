"""The ``mqtt`` transport: MQTT 5, QoS 1, the CloudEvents MQTT binary binding.

What goes on the wire: one PUBLISH per event (QoS 1, not retained) to the
rendered ``topic``; the payload is the event data; the CloudEvents attributes
are MQTT 5 *user properties* under their unprefixed names (``specversion``,
``id``, ``source``, ``type``, ``partitionkey``, ...), and ``datacontenttype``
is the PUBLISH *Content Type* property — the binary mode of the CloudEvents
MQTT protocol binding.

Outcomes: a PUBACK below 0x80 (0x10 "no matching subscribers" included) is
:class:`Delivered`; from 0x80 up the reason code decides (see
:mod:`outrelay_mqtt._codes`): e.g. 0x87 not authorised and 0x95 packet too
large are :class:`Rejected`, 0x97 quota exceeded is :class:`RetryLater`.
A lost connection or a PUBACK that does not come within ``ack_timeout`` is
RetryLater. Data over ``max_message_bytes``, or a packet over the broker's
Maximum Packet Size (learned from CONNACK), is Rejected without sending.

Order: one connection; MQTT keeps a connection's messages in order per topic,
so a batch is *pipelined* (``ordered_batches``) through
:func:`~outrelay.kit.send_pipelined`: a stream stops at its first local
failure, and a broker refusing one message but accepting the next is logged.
No broker-side dedupe (MQTT has none for QoS 1). ``open`` raises
RetryableError when the broker is down or busy and PermanentError when it
refuses the client (bad credentials, not authorised).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from outrelay.kit import (
    Capabilities,
    Delivered,
    Event,
    LifecycleTransport,
    Message,
    Reader,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    Template,
    binary_headers,
    send_pipelined,
)
from outrelay_mqtt._client import Bridge, Outcome, packet_size, publish_properties
from outrelay_mqtt._codes import classify, describe
from outrelay_mqtt._config import MqttConfig, escape_level

__all__ = ["MqttTransport"]

log = logging.getLogger("outrelay.transports.mqtt")


class MqttTransport(LifecycleTransport[MqttConfig]):
    """See the module docstring."""

    name = "mqtt"
    Config = MqttConfig
    # for `outrelay conformance`: per-check topics, a dead endpoint, and where the fault proxy goes
    conformance_target_option: ClassVar[str | None] = "topic"
    conformance_unreachable_options: ClassVar[Mapping[str, Any] | None] = {"host": "127.0.0.1", "port": 1}
    conformance_endpoint_options: ClassVar[tuple[str, str]] = ("host", "port")

    def __init__(self, config: MqttConfig, *, destination: str = "mqtt") -> None:
        super().__init__(config, destination=destination)
        self._topic = Template(config.topic, where=f"destinations.{destination}.topic", escape=escape_level)
        self._bridge: Bridge | None = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            ordering_by_key=True,
            ordered_batches=True,
            max_batch_count=500,
            max_message_bytes=self.cfg.max_message_bytes,
            cloudevents_modes=("binary",),
            reader=True,
            delivery="at_most_once",  # QoS 1 reaches the subscribers connected now: nothing is kept for later ones
        )

    def target(self, event: Event) -> str:
        return self._topic.render(event)

    def bridge(self, role: str, **kwargs: Any) -> Bridge:
        """A new connection configured like this transport (``role`` names it in errors)."""
        c = self.cfg
        return Bridge(
            host=c.host,
            port=c.port,
            client_id=c.client_id if c.client_id and role == "publisher" else Bridge.new_client_id("outrelay"),
            keepalive=c.keepalive,
            connect_timeout=c.connect_timeout,
            username=c.username,
            password=c.password.get_secret_value() if c.password else None,
            where=f"mqtt {role} of destination {self.destination!r}",
            **kwargs,
        )

    async def _open(self) -> None:
        self._bridge = self.bridge("publisher")
        await self._bridge.start(self.cfg.connect_timeout + 1.0)

    async def _close(self) -> None:
        bridge, self._bridge = self._bridge, None
        if bridge is not None:
            await bridge.stop()

    async def _check(self) -> str:
        b = self._bridge
        assert b is not None
        limit = b.maximum_packet_size or "none"
        where = f"{self.cfg.host}:{self.cfg.port}"
        return f"MQTT 5 broker {where} (receive maximum {b.receive_maximum}, max packet {limit})"

    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        bridge = self._bridge
        if bridge is None:
            raise RetryableError(f"mqtt destination {self.destination!r} has no connection")

        async def start(m: Message) -> asyncio.Future[Any] | SendResult:
            data = m.event.data
            if len(data) > (most := self.cfg.max_message_bytes):
                return Rejected(f"event data of {len(data)} bytes exceeds max_message_bytes={most}")
            props = publish_properties(binary_headers(m.event, prefix=""), m.event.content_type)
            limit = bridge.maximum_packet_size
            if limit is not None and (size := packet_size(m.target, data, props)) > limit:
                return Rejected(f"PUBLISH of {size} bytes exceeds the broker's Maximum Packet Size {limit}")
            begun = await bridge.publish(m.target, data, props)
            return RetryLater(begun) if isinstance(begun, str) else begun

        return await send_pipelined(
            batch,
            start,
            self._outcome,
            timeout=self.cfg.ack_timeout,
            destination=self.destination,
            log=log,
            fix="lower max_in_flight to 1",
        )

    def _outcome(self, m: Message, fut: asyncio.Future[Any]) -> SendResult:
        if fut.cancelled():
            return RetryLater(f"no PUBACK for event {m.event.id} within ack_timeout={self.cfg.ack_timeout:g}s")
        code, reason = fut.result()
        return outcome_of((code, reason), m.target)

    def reader(self, target: str, **options: Any) -> Reader:
        from outrelay_mqtt._reader import MqttReader

        return MqttReader(self, target)


def outcome_of(outcome: Outcome, topic: str) -> SendResult:
    """A PUBACK ``(code, reason string)`` (code -1: connection lost) as a SendResult."""
    code, reason = outcome
    if code < 0:
        return RetryLater(reason)
    kind = classify(code)
    if kind == "ok":
        return Delivered()
    text = describe(code, f"broker refused PUBLISH to {topic!r}") + (f" — {reason}" if reason else "")
    return Rejected(text) if kind == "reject" else RetryLater(text)
