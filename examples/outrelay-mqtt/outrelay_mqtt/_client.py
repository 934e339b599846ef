"""An asyncio bridge over paho-mqtt 2.x (MQTT 5), shared by the transport and the reader.

paho runs its network loop in a thread (``loop_start``); its callbacks hand
their outcome to the event loop with ``call_soon_threadsafe``. The traps of
the library, and how this module avoids them:

* **Receive Maximum.** paho ignores the broker's Receive Maximum (CONNACK);
  sending more unacknowledged QoS 1 messages than that makes the broker
  disconnect. paho's own in-flight limit is switched off and an
  ``asyncio.Semaphore`` sized from CONNACK bounds the messages awaiting PUBACK.
* **User properties append.** Assigning ``Properties.UserProperty`` appends
  to the list; a fresh ``Properties`` is built per message and the list is
  assigned once.
* **Maximum Packet Size.** paho does not check the broker's limit (the broker
  would disconnect): :func:`packet_size` is checked first and an oversized
  message is rejected locally.
* **A PUBACK may beat ``publish()``'s return** (the network thread is
  faster): outcomes of not yet registered packet ids wait in ``_early``.
* **PUBACK 0x95.** Mosquitto answers a message over its
  ``message_size_limit`` with PUBACK reason code 0x95 (packet too large),
  which MQTT 5 lists for CONNACK/DISCONNECT only; paho then treats the
  PUBACK as malformed and drops the connection. The module adds PUBACK to
  paho's table entry for 0x95 once, at import.
* **File descriptors.** ``loop_start`` opens a wake-up socket pair that
  ``loop_stop`` leaves open until the client is garbage collected;
  :meth:`Bridge.stop` closes it (paho's ``_reset_sockets``, when present).
* **Reconnects.** paho reconnects by itself; a lost connection fails every
  message awaiting its PUBACK (RetryLater — paho may still resend it: a
  duplicate, never a loss), and publishing while disconnected is refused at
  once instead of being queued inside paho.

Every callback swallows ``RuntimeError`` from a loop that already closed,
so no exception is left in paho's thread; :meth:`Bridge.stop` joins it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from outrelay.kit import PermanentError, RetryableError, redact
from outrelay_mqtt._codes import classify, describe

__all__ = ["Bridge", "Outcome", "packet_size", "publish_properties"]


def _accept_puback_packet_too_large() -> None:
    """Let paho parse PUBACK reason code 0x95 (see the module docstring): Mosquitto sends it for a message
    over ``message_size_limit``, and paho, which knows 0x95 only for CONNACK/DISCONNECT, would call the
    PUBACK malformed and drop the connection. Idempotent; a paho without the table is left alone."""
    table = getattr(ReasonCode, "names", {}).get(0x95, {})
    for packets in table.values():
        if isinstance(packets, list) and PacketTypes.PUBACK not in packets:
            packets.append(PacketTypes.PUBACK)


_accept_puback_packet_too_large()

#: (reason code, reason string) of a PUBACK, or (-1, why) when the connection was lost
Outcome = tuple[int, str]


def publish_properties(user: dict[str, str], content_type: str | None) -> Properties:
    """PUBLISH properties: the user properties once (see the module docstring), the content type."""
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    if user:
        props.UserProperty = list(user.items())
    if content_type:
        props.ContentType = content_type
    return props


def _varint_len(n: int) -> int:
    size = 1
    while n >= 128:
        n //= 128
        size += 1
    return size


def packet_size(topic: str, payload: bytes, props: Properties) -> int:
    """Bytes of the QoS 1 PUBLISH packet for ``topic``/``payload``/``props``."""
    packed: bytes = props.pack()  # type: ignore[no-untyped-call]
    remaining = 2 + len(topic.encode("utf-8")) + 2 + len(packed) + len(payload)
    return 1 + _varint_len(remaining) + remaining


class Bridge:
    """One MQTT 5 connection: connect, publish with a PUBACK future, subscribe, stop."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        client_id: str,
        keepalive: int,
        connect_timeout: float,
        username: str | None,
        password: str | None,
        where: str,
        on_message: Callable[[mqtt.MQTTMessage], None] | None = None,
    ) -> None:
        self.host, self.port, self.keepalive, self.where = host, port, keepalive, where
        self.receive_maximum = 65535
        self.maximum_packet_size: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, asyncio.Future[Outcome]] = {}
        self._early: dict[int, Outcome] = {}
        self._inflight: asyncio.Semaphore | None = None
        self._connack: asyncio.Future[tuple[int, Properties | None]] | None = None
        self._subacks: dict[int, asyncio.Future[list[int]]] = {}
        self._on_message = on_message
        self._started = False
        c = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        c.max_inflight_messages_set(0)  # the semaphore bounds in-flight messages (Receive Maximum)
        c.connect_timeout = connect_timeout
        c.reconnect_delay_set(1, 5)
        if username is not None:
            c.username_pw_set(username, password)
        c.on_connect = self._cb_connect
        c.on_disconnect = self._cb_disconnect
        c.on_publish = self._cb_publish
        c.on_subscribe = self._cb_subscribe
        c.on_message = self._cb_message
        self.client = c

    @staticmethod
    def new_client_id(prefix: str) -> str:
        return f"{prefix}-{uuid.uuid4().hex[:12]}"

    # -- called on the event loop -------------------------------------------------

    async def start(self, timeout: float) -> None:
        """Connect and wait for CONNACK.

        :raises RetryableError: the broker is unreachable, busy or did not answer in time.
        :raises PermanentError: the broker refused us (credentials, authorisation, protocol).
        """
        self._loop = loop = asyncio.get_running_loop()
        self._connack = loop.create_future()
        props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
        props.SessionExpiryInterval = 0
        try:
            await asyncio.wait_for(
                asyncio.to_thread(self.client.connect, self.host, self.port, self.keepalive, properties=props), timeout
            )
        except (OSError, TimeoutError) as exc:
            raise RetryableError(
                redact(
                    f"{self.where}: cannot connect to {self.host}:{self.port} ({type(exc).__name__}: {exc}); "
                    "is the broker running?"
                )
            ) from exc
        self.client.loop_start()
        self._started = True
        try:
            code, cprops = await asyncio.wait_for(asyncio.shield(self._connack), timeout)
        except TimeoutError:
            raise RetryableError(f"{self.where}: no CONNACK from {self.host}:{self.port} within {timeout:g}s") from None
        kind = classify(code)
        if kind != "ok":
            error = PermanentError if kind == "reject" else RetryableError
            raise error(describe(code, f"{self.where}: broker {self.host}:{self.port} refused the connection"))
        if cprops is not None:
            self.receive_maximum = int(getattr(cprops, "ReceiveMaximum", 65535))
            size = getattr(cprops, "MaximumPacketSize", None)
            self.maximum_packet_size = int(size) if size is not None else None
        self._inflight = asyncio.Semaphore(self.receive_maximum)

    def connected(self) -> bool:
        return self._started and self.client.is_connected()

    async def publish(self, topic: str, payload: bytes, props: Properties) -> asyncio.Future[Outcome] | str:
        """Start a QoS 1 publish; a future of its PUBACK outcome, or why it was not sent."""
        assert self._inflight is not None and self._loop is not None
        await self._inflight.acquire()
        if not self.connected():
            self._inflight.release()
            return f"{self.where}: not connected to {self.host}:{self.port} (reconnecting)"
        fut: asyncio.Future[Outcome] = self._loop.create_future()
        fut.add_done_callback(lambda _f: self._inflight.release() if self._inflight else None)
        info = self.client.publish(topic, payload, qos=1, properties=props)
        if info.rc != mqtt.MQTT_ERR_SUCCESS:
            fut.cancel()
            return f"{self.where}: publish failed: {mqtt.error_string(info.rc)}"
        with self._lock:
            early = self._early.pop(info.mid, None)
            if early is None:
                self._pending[info.mid] = fut
        if early is not None:
            fut.set_result(early)
        return fut

    async def subscribe(self, topic: str, timeout: float) -> None:
        """Subscribe with QoS 1 and wait for SUBACK. :raises PermanentError/RetryableError: refused or no answer."""
        assert self._loop is not None
        fut: asyncio.Future[list[int]] = self._loop.create_future()
        with self._lock:
            rc, mid = self.client.subscribe(topic, qos=1)
            if rc != mqtt.MQTT_ERR_SUCCESS or mid is None:
                raise RetryableError(f"{self.where}: subscribe failed: {mqtt.error_string(rc)}")
            self._subacks[mid] = fut
        try:
            codes = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise RetryableError(f"{self.where}: no SUBACK within {timeout:g}s") from None
        bad = [c for c in codes if c >= 0x80]
        if bad:
            raise PermanentError(describe(bad[0], f"{self.where}: subscribing to {topic!r} was refused"))

    async def stop(self) -> None:
        """Disconnect and join paho's thread; idempotent."""
        if self._started:
            self._started = False
            self.client.disconnect()
            await asyncio.to_thread(self.client.loop_stop)
        else:
            self.client.disconnect()  # a connect() that got no further: close its socket
        # paho keeps loop_start()'s wake-up socket pair until the client is garbage collected
        reset = getattr(self.client, "_reset_sockets", None)
        if reset is not None:
            reset(sockpair_only=True)
        self._fail_pending(f"{self.where}: connection closed")

    # -- called on paho's thread ----------------------------------------------------

    def _call(self, fn: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
            loop.call_soon_threadsafe(fn, *args)

    @staticmethod
    def _settle(fut: asyncio.Future[Any], value: Any) -> None:
        if not fut.done():
            fut.set_result(value)

    def _cb_connect(self, _c: Any, _u: Any, _flags: Any, rc: ReasonCode, props: Properties | None) -> None:
        if self._connack is not None:
            self._call(self._settle, self._connack, (int(rc.value), props))

    def _cb_disconnect(self, _c: Any, _u: Any, _flags: Any, rc: ReasonCode, _props: Any) -> None:
        why = f"{self.where}: connection lost" + (f" ({describe(int(rc.value), 'broker')})" if rc.is_failure else "")
        self._fail_pending(why)

    def _fail_pending(self, why: str) -> None:
        with self._lock:
            pending, self._pending = self._pending, {}
            self._early.clear()
        for fut in pending.values():
            self._call(self._settle, fut, (-1, why))

    def _cb_publish(self, _c: Any, _u: Any, mid: int, rc: ReasonCode, props: Properties | None) -> None:
        reason = str(getattr(props, "ReasonString", "") or "") if props is not None else ""
        outcome: Outcome = (int(rc.value), reason)
        with self._lock:
            fut = self._pending.pop(mid, None)
            if fut is None:
                self._early[mid] = outcome
                return
        self._call(self._settle, fut, outcome)

    def _cb_subscribe(self, _c: Any, _u: Any, mid: int, codes: list[ReasonCode], _props: Any) -> None:
        with self._lock:
            fut = self._subacks.pop(mid, None)
        if fut is not None:
            self._call(self._settle, fut, [int(c.value) for c in codes])

    def _cb_message(self, _c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if self._on_message is not None:
            self._call(self._on_message, msg)
