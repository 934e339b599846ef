"""Trace context on the wire: a trace started before ``append`` is the parent of the relay's
send span and reaches real Kafka (tansu or OUTRELAY_KAFKA_BOOTSTRAP), NATS JetStream and
webhook receivers as the CloudEvents ``traceparent`` attribute."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.kafka._transport import KafkaConfig, KafkaTransport
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._transport import NatsTransport
from outrelay.transports.webhook.receiver import WebhookReceiver
from tests.peers.kafka import KafkaPeer, new_topic
from tests.peers.nats import StreamFactory
from tests.plugins.test_otel import Tracing, traceparent, tracing
from tests.transports.webhook_support import SECRET

__all__ = ["tracing"]  # the fixture, imported for this module's tests


async def relay_traced(tmp_path: Path, tracing: Tracing, destination: dict[str, Any]) -> str:
    """Append 3 events under one producer span, drain them to ``destination``; check the
    send spans and return the producer's traceparent."""
    url = f"sqlite:///{tmp_path}/o.db"
    with Outbox.open(url) as outbox:
        with tracing.tracer.start_as_current_span("checkout") as producer:
            outbox.append([Event(type="order.paid", stream=f"s{i}", data={"i": i}) for i in range(3)])
        cfg = parse_config(
            {
                "outbox": {"url": url},
                "relay": {"poll_interval": 0.05},
                "destinations": {"d": {**destination, "retry": {"initial_delay": 0.05}}},
            }
        )
        summary = await Relay(outbox, cfg).run(drain=True)
    assert summary.counts["d"]["delivered"] == 3
    sends = tracing.spans("outrelay.send")
    pctx = producer.get_span_context()
    assert len(sends) == 3
    assert all(s.parent is not None and s.parent.span_id == pctx.span_id for s in sends)
    assert all(s.context.trace_id == pctx.trace_id for s in sends)
    return traceparent(producer)


async def test_kafka_headers_carry_the_producer_trace(tmp_path: Path, tracing: Tracing, kafka_peer: KafkaPeer) -> None:
    """Kafka records carry ce_traceparent (the producer's span), decoded back into metadata."""
    topic = await new_topic(kafka_peer, prefix="otel", partitions=1)
    options = kafka_peer.options(topic)
    async with KafkaTransport(KafkaConfig.model_validate(options)).reader(topic) as reader:
        tp = await relay_traced(tmp_path, tracing, {"transport": "kafka", **options})
        got = await reader.read(3, 20)
    assert [r.headers["ce_traceparent"] for r in got] == [tp] * 3
    assert all(r.event.metadata["traceparent"] == tp for r in got)
    assert {s.attributes["messaging.system"] for s in tracing.spans("outrelay.send") if s.attributes} == {"kafka"}


async def test_nats_headers_carry_the_producer_trace(
    tmp_path: Path, tracing: Tracing, nats_url: str, nats_streams: StreamFactory
) -> None:
    """JetStream messages carry the ce-traceparent header (the producer's span)."""
    name, prefix = await nats_streams("otel")
    reader_t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{stream}"))
    async with reader_t.reader(f"{prefix}.>") as reader:
        dest = {"transport": "nats", "servers": [nats_url], "subject": prefix + ".{stream}", "expected_stream": name}
        tp = await relay_traced(tmp_path, tracing, dest)
        got = await reader.read(3, 10)
    assert [r.headers["ce-traceparent"] for r in got] == [tp] * 3
    assert all(r.event.metadata["traceparent"] == tp for r in got)


@pytest.mark.parametrize("mode", ["binary", "structured"])
async def test_webhook_requests_carry_the_producer_trace(tmp_path: Path, tracing: Tracing, mode: str) -> None:
    """Webhook requests carry ce-traceparent (binary mode) or a top-level traceparent member (structured)."""
    async with WebhookReceiver(secrets=SECRET) as rx:
        dest = {
            "transport": "webhook",
            "url": rx.url + "/hook",
            "secret": SECRET,
            "allow_private_network": True,
            "mode": mode,
        }
        tp = await relay_traced(tmp_path, tracing, dest)
        requests = list(rx.requests)
    assert len(requests) == 3 and all(r.verified for r in requests)
    if mode == "binary":
        assert [r.headers["ce-traceparent"] for r in requests] == [tp] * 3
    else:
        assert [orjson.loads(r.body)["traceparent"] for r in requests] == [tp] * 3
    assert all(r.event is not None and r.event.metadata["traceparent"] == tp for r in requests)
