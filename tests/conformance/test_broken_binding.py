"""Each binding check fails a ``line`` transport with the one defect it is meant to catch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from outrelay.conformance import Binding
from outrelay.conformance._binding import HTTP
from outrelay.core.contract.transport import Message
from tests.conformance._broken import assert_fails
from tests.conformance._line import LineTransport, line_target


class EmptyContentType(LineTransport):
    """Percent-encodes like HTTP, but sends an empty content-type header for events without one."""

    percent = True

    def request(self, m: Message) -> dict[str, Any]:
        return super().request(m) | {"empty_ct": True}


def test_binding_rules_catches_unencoded_header_values(tmp_path: Path) -> None:
    # plain ``line`` sends raw UTF-8 header values: fine for NATS, wrong for the HTTP binding it now claims
    assert_fails(line_target(LineTransport, binding=HTTP), "binding_rules", tmp_path, "unencoded")


def test_binding_rules_catches_wrong_prefix(tmp_path: Path) -> None:
    kafka_like = Binding("kafka", prefix="ce_")
    assert_fails(line_target(LineTransport, binding=kafka_like), "binding_rules", tmp_path, "required attribute")


def test_binding_sdk_decode_catches_what_the_sdk_refuses(tmp_path: Path) -> None:
    assert_fails(line_target(EmptyContentType, binding=HTTP), "binding_sdk_decode", tmp_path, "SDK's http binding")


def test_ready_made_bindings_are_public() -> None:
    """The ready-made bindings import from outrelay.conformance itself, as the docs write them."""
    from outrelay.conformance import AMQP, HTTP, KAFKA, MQTT, NATS, STRUCTURED, __all__

    assert (HTTP.prefix, KAFKA.prefix, AMQP.prefix, MQTT.prefix, NATS.prefix) == (
        "ce-",
        "ce_",
        "cloudEvents_",
        "",
        "ce-",
    )
    assert STRUCTURED.structured_only and {"HTTP", "KAFKA", "AMQP", "MQTT", "NATS", "STRUCTURED"} <= set(__all__)
