"""The outrelay conformance suite against the ``mqtt`` transport and a real Mosquitto."""

from __future__ import annotations

import pytest

from outrelay.conformance import Binding, ConformanceSuite, ConformanceTarget

pytest.importorskip(
    "outrelay_mqtt", reason="the example plugin is not installed: pip install -e examples/outrelay-mqtt"
)
from outrelay_mqtt import MqttConfig, MqttTransport


class TestMqttConformance(ConformanceSuite):
    """Every check passes or skips with a reason from the declared capabilities."""

    @pytest.fixture
    def conformance_target(self, mqtt_broker: tuple[str, int], own_mosquitto: tuple[int, int]) -> ConformanceTarget:
        host, port = mqtt_broker

        def make(
            topic: str, *, at: tuple[str, int] = (host, port), secret: str | None = None, wait: float = 2.0
        ) -> MqttTransport:
            options = {"username": "outrelay", "password": secret} if secret else {}
            return MqttTransport(
                MqttConfig(
                    host=at[0],
                    port=at[1],
                    topic=topic,
                    max_message_bytes=65536,
                    connect_timeout=min(1.5, wait),
                    ack_timeout=wait,
                    **options,  # type: ignore[arg-type]
                )
            )

        return ConformanceTarget(
            make_transport=make,
            make_unreachable=lambda topic: make(topic, at=("127.0.0.1", 1)),
            upstream=lambda _topic: (host, port),
            # through the suite's proxy a stalled or black-holed call costs each fault check this long
            make_transport_via=lambda topic, h, p: make(topic, at=(h, p), wait=1.0),
            make_forbidden=lambda topic: make(topic, at=("127.0.0.1", own_mosquitto[1]), secret="s3cr3t-mqtt-pw"),
            secret="s3cr3t-mqtt-pw",
            unsupported={
                "refuse_target": "Mosquitto refuses no topic per message without an ACL file (QoS 1 PUBACK is success)",
                "throttle": (
                    "MQTT has no throttling answer carrying a retry hint (Mosquitto never throttles a QoS 1 publisher)"
                ),
            },
            label=f"mqtt (Mosquitto at {host}:{port})",
            binding=Binding("mqtt", prefix="", content_type_header="content-type"),
            read_timeout=5.0,
            timeout=5.0,
        )
