"""OpenTelemetry tracing: trace context stored at append, relay spans, subscriber spans.

Spans are captured with the SDK's in-memory exporter on a tracer provider of
the test's own (never the process-global one); brokers here are the memory
transport (the Kafka/NATS/webhook wire checks are in test_otel_wire.py).
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, StatusCode, TraceFlags, TraceState

from outrelay import Event, EventBus, Outbox, Relay, parse_config, read_stream
from outrelay.core.model import tracecontext
from outrelay.plugins.otel import disable_tracing, enable_tracing
from outrelay.transports.memory import MemoryTransport
from tests.stores.conftest import pg_schema, pg_url

__all__ = ["pg_schema"]  # the fixture, imported for a test below


class Tracing:
    """A private SDK provider whose finished spans land in :attr:`exporter`."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.provider = TracerProvider()
        self.provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = self.provider.get_tracer("tests")

    def spans(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.exporter.get_finished_spans() if s.name == name]


@pytest.fixture
def tracing() -> Iterator[Tracing]:
    t = Tracing()
    enable_tracing(t.provider)
    try:
        yield t
    finally:
        disable_tracing()
        t.provider.shutdown()


def traceparent(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def memory_config(url: str, **dest: Any) -> Any:
    return parse_config(
        {
            "outbox": {"url": url},
            "relay": {"poll_interval": 0.05},
            "destinations": {"m": {"transport": "memory", "broker": "otel", **dest}},
        }
    )


class TestAppend:
    def test_append_inside_a_span_stores_its_context(self, tmp_path: Path, tracing: Tracing) -> None:
        """Events appended while a span is current are stored with its traceparent; others get none."""
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox:
            with tracing.tracer.start_as_current_span("checkout") as span:
                outbox.append([Event(type="t", stream="s", data=1), Event(type="t", stream="s", data=2)])
            outbox.append(Event(type="t", stream="s", data=3))
            got = list(read_stream(outbox.store, "s"))
        assert [e.metadata.get("traceparent") for e in got] == [traceparent(span)] * 2 + [None]
        assert [e.json() for e in got] == [1, 2, 3]

    async def test_aappend_stamps_too(self, tmp_path: Path, tracing: Tracing) -> None:
        """The asyncio append path stores the current span's context as well."""
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox:
            with tracing.tracer.start_as_current_span("checkout") as span:
                await outbox.aappend(Event(type="t", stream="s"))
            (got,) = read_stream(outbox.store, "s")
        assert got.metadata["traceparent"] == traceparent(span)

    def test_tracestate_and_existing_context_are_kept(self, tmp_path: Path, tracing: Tracing) -> None:
        """tracestate travels with traceparent; an event that already has a traceparent keeps it."""
        remote = SpanContext(
            0x1234, 0x5678, is_remote=True, trace_flags=TraceFlags(1), trace_state=TraceState([("vendor", "v1")])
        )
        mine = "00-0000000000000000000000000000abcd-00000000000000ef-01"
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox, trace.use_span(NonRecordingSpan(remote)):
            outbox.append(
                [
                    Event(type="t", stream="s", metadata={"k": "v"}),
                    Event(type="t", stream="s", metadata={"traceparent": mine}),
                ]
            )
            first, second = read_stream(outbox.store, "s")
        assert dict(first.metadata) == {
            "k": "v",
            "traceparent": "00-00000000000000000000000000001234-0000000000005678-01",
            "tracestate": "vendor=v1",
        }
        assert dict(second.metadata) == {"traceparent": mine}

    def test_nothing_is_stored_while_tracing_is_off(self, tmp_path: Path) -> None:
        """With tracing off, a current span leaves appended events untouched."""
        t = Tracing()
        assert not tracecontext.active
        with Outbox.open(f"sqlite:///{tmp_path}/o.db") as outbox, t.tracer.start_as_current_span("x"):
            outbox.append(Event(type="t", stream="s"))
            (got,) = read_stream(outbox.store, "s")
        assert dict(got.metadata) == {}


class TestRelaySpans:
    async def test_send_span_is_a_child_of_the_producer_span(self, tmp_path: Path, tracing: Tracing) -> None:
        """Each traced event gets an outrelay.send PRODUCER span under the producer's span, and its
        traceparent in the broker headers; claim and settle spans link to the producer."""
        url = f"sqlite:///{tmp_path}/o.db"
        outbox = Outbox.open(url)
        with tracing.tracer.start_as_current_span("checkout") as producer:
            outbox.append([Event(type="order.paid", stream="o1"), Event(type="order.paid", stream="o2")])
        outbox.append(Event(type="order.paid", stream="o3"))  # untraced: no send span of its own
        summary = await Relay(outbox, memory_config(url)).run(drain=True)
        outbox.close()
        assert summary.counts["m"]["delivered"] == 3
        sends = tracing.spans("outrelay.send")
        pctx = producer.get_span_context()
        assert len(sends) == 2
        for s in sends:
            assert s.kind is SpanKind.PRODUCER
            assert s.parent is not None and s.parent.span_id == pctx.span_id
            assert s.context.trace_id == pctx.trace_id
            assert s.attributes is not None
            assert s.attributes["outrelay.outcome"] == "delivered"
            assert s.attributes["messaging.system"] == "memory"
            assert s.attributes["messaging.destination.name"] == "order.paid"
            assert s.start_time is not None and s.end_time is not None and s.start_time <= s.end_time
        headers = [r.headers for r in MemoryTransport.broker("otel").all()]
        assert sorted(h.get("ce-traceparent", "") for h in headers) == [
            "",
            traceparent(producer),
            traceparent(producer),
        ]
        for name in ("outrelay.claim", "outrelay.settle"):
            batch_spans = tracing.spans(name)
            assert batch_spans, name
            linked = {link.context.span_id for s in batch_spans for link in s.links}
            assert linked == {pctx.span_id}, name
        claims = {s.context.span_id for s in tracing.spans("outrelay.claim")}
        assert all(link.context.span_id in claims for s in sends for link in s.links)
        routes = tracing.spans("outrelay.route")  # routing passes: every appended event routed once
        assert routes and sum(int((r.attributes or {})["outrelay.routed_events"]) for r in routes) == 3
        assert all(r.start_time is not None and r.end_time is not None and r.start_time <= r.end_time for r in routes)

    async def test_postgres_outbox_carries_the_context_too(self, pg_schema: str, tracing: Tracing) -> None:
        """With a PostgreSQL outbox (its own claim path), the send span still has the producer as parent
        and the broker headers carry its traceparent."""
        url = pg_url(pg_schema)
        outbox = Outbox.open(url)
        with tracing.tracer.start_as_current_span("checkout") as producer:
            await outbox.aappend([Event(type="t", stream="a"), Event(type="t", stream="b")])
        summary = await Relay(outbox, memory_config(url)).run(drain=True)
        outbox.close()
        assert summary.counts["m"]["delivered"] == 2
        assert [s.parent.span_id for s in tracing.spans("outrelay.send") if s.parent] == [
            producer.get_span_context().span_id
        ] * 2
        headers = [r.headers for r in MemoryTransport.broker("otel").all()]
        assert [h["ce-traceparent"] for h in headers] == [traceparent(producer)] * 2

    async def test_a_rejected_event_marks_its_send_span(self, tmp_path: Path, tracing: Tracing) -> None:
        """A permanently refused event's send span has status ERROR and outcome rejected."""
        url = f"sqlite:///{tmp_path}/o.db"
        outbox = Outbox.open(url)
        with tracing.tracer.start_as_current_span("checkout"):
            outbox.append(Event(type="bad", stream="s"))
        await Relay(outbox, memory_config(url, reject_types=["bad"])).run(drain=True)
        outbox.close()
        (send,) = tracing.spans("outrelay.send")
        assert send.status.status_code is StatusCode.ERROR
        assert send.attributes is not None and send.attributes["outrelay.outcome"] == "rejected"

    async def test_no_spans_while_tracing_is_off(self, tmp_path: Path) -> None:
        """Without tracing, the relay records nothing even for events that carry a traceparent."""
        t = Tracing()
        url = f"sqlite:///{tmp_path}/o.db"
        outbox = Outbox.open(url)
        tp = "00-0000000000000000000000000000abcd-00000000000000ef-01"
        outbox.append(Event(type="t", stream="s", metadata={"traceparent": tp}))
        await Relay(outbox, memory_config(url)).run(drain=True)
        outbox.close()
        assert t.exporter.get_finished_spans() == ()
        assert MemoryTransport.broker("otel").all()[0].headers["ce-traceparent"] == tp  # still passed through

    async def test_config_switch_with_console_exporter(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """[tracing] enabled = true turns tracing on for the relay's run only; exporter = console
        prints the spans, flushed when the relay stops."""
        url = f"sqlite:///{tmp_path}/o.db"
        outbox = Outbox.open(url)
        tp = "00-0000000000000000000000000000abcd-00000000000000ef-01"
        outbox.append(Event(type="t", stream="s", metadata={"traceparent": tp}))
        cfg = parse_config(
            {
                "outbox": {"url": url},
                "tracing": {"enabled": True, "exporter": "console", "service_name": "relay-test"},
                "destinations": {"m": {"transport": "memory", "broker": "otel"}},
            }
        )
        await Relay(outbox, cfg).run(drain=True)
        outbox.close()
        out = capsys.readouterr().out
        assert '"name": "outrelay.send"' in out and "relay-test" in out
        assert '"trace_id": "0x0000000000000000000000000000abcd"' in out
        assert not tracecontext.active


class TestSubscriber:
    @pytest.mark.parametrize("kind", ["async", "sync"])
    async def test_handler_runs_in_a_consumer_span_under_the_producer(self, tracing: Tracing, kind: str) -> None:
        """A handler (async, or sync in a worker thread) sees a current CONSUMER span whose parent is
        the span the event was appended under; a raising attempt's span is an error."""
        seen: list[Any] = []
        done = threading.Event()

        def record(event: Event) -> None:
            seen.append(trace.get_current_span().get_span_context())
            if len(seen) == 1:
                raise RuntimeError("first attempt fails")
            done.set()

        async def ahandler(event: Event) -> None:
            record(event)

        async with EventBus.memory() as bus:
            await bus.subscribe(ahandler if kind == "async" else record, max_attempts=3)
            with tracing.tracer.start_as_current_span("checkout") as producer:
                (event,) = tracecontext.stamp([Event(type="t", stream="s")])
            await bus.publish(event)
            for _ in range(200):
                if done.is_set():
                    break
                await asyncio.sleep(0.02)
        assert done.is_set()
        spans = tracing.spans("outrelay.process")
        assert len(spans) == 2
        pctx = producer.get_span_context()
        for s in spans:
            assert s.kind is SpanKind.CONSUMER
            assert s.parent is not None and s.parent.span_id == pctx.span_id
            assert s.context.trace_id == pctx.trace_id
        assert {s.context.span_id for s in spans} == {c.span_id for c in seen}
        assert [s.status.status_code for s in sorted(spans, key=lambda s: s.start_time or 0)] == [
            StatusCode.ERROR,
            StatusCode.UNSET,
        ]

    async def test_an_event_without_context_gets_no_span(self, tracing: Tracing) -> None:
        """An event without a traceparent is handled outside any outrelay span."""
        seen: list[bool] = []

        async def handler(event: Event) -> None:
            seen.append(trace.get_current_span().get_span_context().is_valid)

        async with EventBus.memory() as bus:
            await bus.subscribe(handler)
            await bus.publish(Event(type="t", stream="s"))
            for _ in range(200):
                if seen:
                    break
                await asyncio.sleep(0.02)
        assert seen == [False]
        assert tracing.spans("outrelay.process") == []


def test_bus_from_config_with_tracing_enabled_turns_it_on(tmp_path: Path) -> None:
    """EventBus.from_config honours ``[tracing] enabled``: a subscriber-only process traces too."""
    import os

    (tmp_path / "outrelay.toml").write_text(
        f'[outbox]\nurl = "sqlite:///{tmp_path}/o.db"\n[tracing]\nenabled = true\n'
        '[destinations.m]\ntransport = "memory"\n'
    )
    code = (
        "from outrelay import EventBus\n"
        "from outrelay.core.model import tracecontext\n"
        f"EventBus.from_config({str(tmp_path / 'outrelay.toml')!r})\n"
        "print(tracecontext.active)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OUTRELAY_TRACING"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_environment_switch_turns_tracing_on(tmp_path: Path) -> None:
    """OUTRELAY_TRACING=1 turns tracing on when an Outbox is created; unset, it stays off."""
    import os

    code = (
        "from outrelay import Outbox\n"
        "from outrelay.core.model import tracecontext\n"
        f"Outbox.open('sqlite:///{tmp_path}/o.db').close()\n"
        "print(tracecontext.active)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OUTRELAY_TRACING"}
    on, off = (
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=e, check=True)
        for e in ({**env, "OUTRELAY_TRACING": "1"}, env)
    )
    assert (on.stdout.strip(), off.stdout.strip()) == ("True", "False")


class TestMissingExtra:
    """Without OpenTelemetry installed, turning tracing on fails with one line naming the extra."""

    BLOCK = "import sys; sys.modules['opentelemetry'] = None\n"

    def run(self, code: str, **env: str) -> subprocess.CompletedProcess[str]:
        import os

        return subprocess.run(
            [sys.executable, "-c", self.BLOCK + code],
            capture_output=True,
            text=True,
            timeout=60,
            env={**os.environ, **env},
            check=False,
        )

    def test_config_names_the_extra(self, tmp_path: Path) -> None:
        """`outrelay run` with [tracing] enabled prints one error line with the pip command, no traceback."""
        conf = tmp_path / "o.toml"
        conf.write_text(
            f'[outbox]\nurl = "sqlite:///{tmp_path}/o.db"\n[tracing]\nenabled = true\n'
            '[destinations.m]\ntransport = "memory"\n'
        )
        proc = self.run(f"from outrelay.cli.main import main; main(['run', '--config', {str(conf)!r}, '--drain'])")
        assert proc.returncode != 0
        assert "Traceback" not in proc.stderr
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "tracing" in lines[0] and "pip install 'outrelay[otel]'" in lines[0], proc.stderr

    def test_environment_switch_names_the_extra(self, tmp_path: Path) -> None:
        """OUTRELAY_TRACING=1 makes Outbox.open raise MissingExtraError with the pip command."""
        code = (
            "from outrelay import Outbox, MissingExtraError\n"
            "try:\n"
            f"    Outbox.open('sqlite:///{tmp_path}/o.db')\n"
            "except MissingExtraError as exc:\n"
            "    print(exc)\n"
        )
        proc = self.run(code, OUTRELAY_TRACING="1")
        assert proc.returncode == 0, proc.stderr
        assert "pip install 'outrelay[otel]'" in proc.stdout and "OUTRELAY_TRACING" in proc.stdout
