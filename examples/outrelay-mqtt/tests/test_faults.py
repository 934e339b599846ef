"""How the ``mqtt`` transport classifies what a real Mosquitto refuses (its own instance per module)."""

from __future__ import annotations

import asyncio

import pytest

from outrelay.kit import Delivered, Event, Message, PermanentError, Rejected, RetryableError, RetryLater

pytest.importorskip(
    "outrelay_mqtt", reason="the example plugin is not installed: pip install -e examples/outrelay-mqtt"
)
from outrelay_mqtt import MqttConfig, MqttTransport
from outrelay_mqtt._client import publish_properties
from outrelay_mqtt._transport import outcome_of


def transport(port: int, topic: str = "open/t", **options: object) -> MqttTransport:
    return MqttTransport(MqttConfig(host="127.0.0.1", port=port, topic=topic, **options))  # type: ignore[arg-type]


async def send(t: MqttTransport, *events: Event) -> list[object]:
    await t.open()
    try:
        return list(await t.send([Message(e, t.target(e), e.stream) for e in events]))
    finally:
        await t.close()


def test_denied_topic_is_rejected_by_puback_code(own_mosquitto: tuple[int, int]) -> None:
    """A topic the broker's ACL denies gives PUBACK 0x87, which is Rejected naming the code and the fix."""
    t = transport(own_mosquitto[0], topic="closed/{stream}")
    [r] = asyncio.run(send(t, Event(type="t", stream="s", data=b"x")))
    assert isinstance(r, Rejected) and "0x87" in r.reason and "ACL" in r.reason


def test_over_the_broker_size_limit_is_rejected(own_mosquitto: tuple[int, int]) -> None:
    """Data over the broker's message size limit gives PUBACK 0x95 (Rejected); the stream's next event is held."""
    t = transport(own_mosquitto[0])
    big, after = Event(type="t", stream="s", data=b"x" * 1500), Event(type="t", stream="s", data=b"y")
    r1, r2 = asyncio.run(send(t, big, after))
    assert isinstance(r1, Rejected) and "0x95" in r1.reason
    assert isinstance(r2, RetryLater | Delivered)  # held back, or stored with the order break logged


def test_over_the_maximum_packet_size_is_rejected_locally(own_mosquitto: tuple[int, int]) -> None:
    """A PUBLISH over the Maximum Packet Size announced in CONNACK is Rejected without being sent."""
    t = transport(own_mosquitto[0])
    [r] = asyncio.run(send(t, Event(type="t", stream="s", data=b"x" * 5000)))
    assert isinstance(r, Rejected) and "Maximum Packet Size 4000" in r.reason


def test_receive_maximum_is_honoured(own_mosquitto: tuple[int, int]) -> None:
    """With a broker Receive Maximum of 2, a batch of 60 is delivered whole (paho alone would overrun it)."""
    t = transport(own_mosquitto[0])

    async def main() -> tuple[int, list[object]]:
        await t.open()
        try:
            assert t._bridge is not None
            events = [Event(type="t", stream=f"s{i % 5}", data=b"x") for i in range(60)]
            results = await t.send([Message(e, t.target(e), e.stream) for e in events])
            return t._bridge.receive_maximum, list(results)
        finally:
            await t.close()

    maximum, results = asyncio.run(main())
    assert maximum == 2
    assert all(isinstance(r, Delivered) for r in results)


def test_refused_credentials_are_permanent(own_mosquitto: tuple[int, int]) -> None:
    """A broker refusing the client in CONNACK (anonymous not allowed) makes open() raise PermanentError."""
    t = transport(own_mosquitto[1], username="nobody", password="wrong-secret")
    with pytest.raises(PermanentError, match=r"refused the connection: reason code 0x8[67]") as info:
        asyncio.run(t.open())
    assert "wrong-secret" not in str(info.value) and "wrong-secret" not in repr(t)
    assert t.state == "new"


def test_nothing_listening_is_retryable() -> None:
    """No broker on the port: open() raises RetryableError saying where it tried."""
    with pytest.raises(RetryableError, match=r"cannot connect to 127\.0\.0\.1:1 "):
        asyncio.run(transport(1).open())


def test_reason_codes_map_to_outcomes() -> None:
    """PUBACK codes: below 0x80 delivered (0x10 no subscribers too), quota retried, topic invalid rejected."""
    assert outcome_of((0x00, ""), "t") == Delivered()
    assert outcome_of((0x10, ""), "t") == Delivered()
    assert isinstance(outcome_of((0x97, "slow down"), "t"), RetryLater)
    assert isinstance(outcome_of((0x90, ""), "t"), Rejected)
    assert isinstance(outcome_of((-1, "connection lost"), "t"), RetryLater)


def test_user_properties_are_set_once() -> None:
    """Each attribute is one user property (paho appends on repeated assignment: built once per message)."""
    props = publish_properties({"id": "1", "type": "t"}, "text/plain")
    assert props.UserProperty == [("id", "1"), ("type", "t")]
    assert props.ContentType == "text/plain"
