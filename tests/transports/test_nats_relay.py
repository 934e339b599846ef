"""End to end: SQLite outbox -> Relay -> NATS JetStream -> reader, including a broker kill -9."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from urllib.parse import urlsplit

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.nats._config import NatsConfig
from outrelay.transports.nats._transport import NatsTransport
from tests.peers._relay import assert_complete_and_ordered, drain_with_cuts
from tests.peers.nats import NatsServer, StreamFactory
from tests.peers.proxy import TcpProxy


async def test_relay_10k_events_50_streams(
    tmp_path: Path,
    nats_url: str,
    nats_streams: StreamFactory,
) -> None:
    """10,000 events over 50 streams relayed from SQLite all arrive, in exact order per stream."""
    name, prefix = await nats_streams("e2e", storage="file")
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.e2e", stream=f"s{i % 50}", data={"i": i}) for i in range(10_000)]
    outbox.append(events)
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "destinations": {
                "n": {
                    "transport": "nats",
                    "servers": [nats_url],
                    "subject": prefix + ".{stream}",
                    "expected_stream": name,
                    "retry": {"initial_delay": 0.05},
                }
            },
        }
    )
    reader_t = NatsTransport(NatsConfig(servers=(nats_url,), subject=prefix + ".{stream}"))
    async with reader_t.reader(f"{prefix}.>") as reader:
        started = time.monotonic()
        summary = await Relay(outbox, cfg).run(drain=True)
        elapsed = time.monotonic() - started
        got = await reader.read(10_000, 20)
        got += await reader.read(10, 0.3)
    outbox.close()
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert summary.counts["n"]["delivered"] == 10_000
    assert_complete_and_ordered(events, got)
    assert elapsed < 60


async def test_relay_survives_broker_kill(tmp_path: Path, nats_server: NatsServer) -> None:
    """kill -9 of the broker mid-drain and a restart a second later: the relay resumes by itself and loses nothing."""
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.chaos", stream=f"s{i % 20}", data={"i": i}) for i in range(6_000)]
    outbox.append(events)
    options = {
        "servers": [nats_server.url],
        "subject": "chaos.{stream}",
        "create_stream": {"name": "CHAOS", "subjects": ["chaos.>"], "storage": "file"},
        "ack_timeout": 1.0,
        "connect_timeout": 0.5,
        "reconnect_time_wait": 0.1,
    }
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.1},
            "destinations": {
                "n": {
                    "transport": "nats",
                    "batch_size": 50,
                    **options,
                    "retry": {"initial_delay": 0.05, "max_delay": 0.5, "max_attempts": 1000},
                }
            },
        }
    )
    relay = Relay(outbox, cfg)
    task = asyncio.create_task(relay.run())
    try:
        deadline = time.monotonic() + 30
        while relay.workers.get("n") is None or relay.workers["n"].counts["delivered"] < 1_000:
            assert time.monotonic() < deadline, "relay did not start delivering"
            await asyncio.sleep(0.005)
        nats_server.kill()
        killed_at = relay.workers["n"].counts["delivered"]
        await asyncio.sleep(1.0)
        nats_server.start()
        deadline = time.monotonic() + 60
        while relay.workers["n"].counts["delivered"] < len(events):
            assert time.monotonic() < deadline, f"stuck at {relay.workers['n'].counts}"
            await asyncio.sleep(0.05)
    finally:
        relay.stop()
        summary = await asyncio.wait_for(task, 30)
    outbox.close()
    assert killed_at < len(events), "the kill came too late to test anything"
    assert summary.remaining == 0 and summary.dead_lettered == 0
    reader_t = NatsTransport(NatsConfig(servers=(nats_server.url,)))
    async with reader_t.reader("chaos.>", stream="CHAOS", deliver="all") as reader:
        got = await reader.read(len(events), 15)
        got += await reader.read(10, 0.3)  # nothing beyond: no duplicate was stored
    assert_complete_and_ordered(events, got)


async def test_pipelined_order_survives_connection_cuts(
    tmp_path: Path, nats_url: str, nats_streams: StreamFactory
) -> None:
    """Pipelining on, the network dropping the connection three times mid-run (nats-py reconnects at
    once, with publishes buffered): nothing lost, nothing stored twice, every stream in exact order —
    what dropping nats-py's unsent buffer on disconnect is for."""
    name, prefix = await nats_streams("cuts", duplicate_window=120)
    parts = urlsplit(nats_url)
    proxy = TcpProxy(parts.hostname or "127.0.0.1", parts.port or 4222)
    await proxy.start()
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.cut", stream=f"s{i % 10}", data={"i": i}) for i in range(6_000)]
    outbox.append(events)
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 0.05},
            "destinations": {
                "n": {
                    "transport": "nats",
                    "servers": [f"nats://127.0.0.1:{proxy.port}"],
                    "subject": prefix + ".{stream}",
                    "expected_stream": name,
                    "ack_timeout": 1.0,
                    "connect_timeout": 1.0,
                    "reconnect_time_wait": 0.05,
                    "batch_size": 300,
                    "per_stream": 50,
                    "retry": {"initial_delay": 0.05, "max_delay": 0.2, "max_attempts": 1000},
                }
            },
        }
    )
    try:
        summary, cuts = await drain_with_cuts(Relay(outbox, cfg), "n", proxy.cut, every=1_200)
    finally:
        outbox.close()
        await proxy.stop()
    assert cuts == 3, "the relay finished before the connection could be cut three times"
    assert summary.remaining == 0 and summary.dead_lettered == 0
    reader_t = NatsTransport(NatsConfig(servers=(nats_url,)))
    async with reader_t.reader(f"{prefix}.>", stream=name, deliver="all") as reader:
        got = await reader.read(len(events), 15)
        got += await reader.read(10, 0.3)  # nothing beyond: no duplicate was stored
    assert_complete_and_ordered(events, got)
