"""The fast AMQP properties encoder (outrelay/transports/rabbitmq/_wire.py) sends pamqp's bytes."""

from __future__ import annotations

import datetime

import pytest
from aiormq import spec

from outrelay import Event
from outrelay.core.model import cloudevents
from outrelay.transports.rabbitmq._wire import Properties

UTC = datetime.UTC


def _both(**values: object) -> tuple[bytes, bytes]:
    return Properties(**values).marshal(), spec.Basic.Properties(**values).marshal()  # type: ignore[arg-type]


def _event(**overrides: object) -> Event:
    fields: dict[str, object] = {"type": "order.created", "stream": "s1", "data": {"n": 1}}
    fields.update(overrides)
    return Event(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "event",
    [
        _event(),
        _event(tenant="acme", correlation_id="c-1", causation_id="k-1", subject="sub", labels={"a": "b"}),
        _event(stream="strøm ✓", tenant="mañana", metadata={"note": "ünïcode 😀"}),
        _event(data=b"raw", content_type="application/octet-stream"),
        _event(time=datetime.datetime(1999, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC)),
        _event(time=datetime.datetime(2030, 1, 1, tzinfo=datetime.timezone(datetime.timedelta(hours=-7)))),
    ],
)
def test_the_transport_properties_of_an_event_encode_to_pamqps_bytes(event: Event) -> None:
    fast, pamqp = _both(
        headers=cloudevents.binary_headers(event, prefix="cloudEvents_"),
        content_type=event.content_type,
        delivery_mode=2,
        priority=0,
        message_id=event.id,
        timestamp=event.time,
        message_type=event.type,
        correlation_id=event.correlation_id,
    )
    assert fast == pamqp


@pytest.mark.parametrize(
    "values",
    [
        {},
        {"delivery_mode": 1},
        {"content_type": "", "message_id": "m", "headers": {}},
        {"content_encoding": "gzip", "reply_to": "r", "expiration": "60000", "user_id": "guest", "app_id": "a"},
        {"timestamp": datetime.datetime(2026, 1, 1, 12, 0, 0)},  # naive: pamqp reads it as UTC
        {"headers": {"b": "2", "a": "1", "c": ""}},  # sorted by name, empty values kept
    ],
)
def test_every_property_and_edge_encodes_to_pamqps_bytes(values: dict[str, object]) -> None:
    fast, pamqp = _both(**values)
    assert fast == pamqp


@pytest.mark.parametrize(
    "values",
    [
        {"headers": {"n": 5, "f": 1.5, "t": True, "nested": {"x": "y"}, "none": None}},  # non-string values
        {"headers": {"k" * 200: "v"}},  # a header name pamqp truncates
    ],
)
def test_values_it_does_not_handle_go_to_pamqp_unchanged(values: dict[str, object]) -> None:
    fast, pamqp = _both(**values)
    assert fast == pamqp


@pytest.mark.parametrize(
    ("values", "error", "match"),
    [
        ({"message_id": "x" * 256}, TypeError, "exceeds maximum length of 255"),
        ({"priority": 300}, Exception, "0 <= number <= 255"),  # struct.error
    ],
)
def test_what_pamqp_refuses_fails_the_same_way(values: dict[str, object], error: type[Exception], match: str) -> None:
    for cls in (Properties, spec.Basic.Properties):
        with pytest.raises(error, match=match):
            cls(**values).marshal()  # type: ignore[arg-type]
