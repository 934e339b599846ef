"""End to end: SQLite outbox -> Relay -> Service Bus (sessions) -> session receivers.

Against the AMQP 1.0 wire-protocol test peer (not Azure Service Bus) unless
OUTRELAY_SERVICEBUS_CONNECTION_STRING names a real namespace.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from outrelay import Event, Outbox, Received, Relay, parse_config
from outrelay.transports.servicebus._config import ServiceBusConfig
from outrelay.transports.servicebus._transport import ServiceBusTransport
from tests.peers._relay import assert_complete_and_ordered
from tests.peers.amqp_servicebus_peer import ServiceBusEnv


async def _relay_and_read(
    tmp_path: Path, env: ServiceBusEnv, n: int, streams: int = 50, **options: Any
) -> tuple[list[Event], Any, list[Received]]:
    queue = await env.provision(f"e2e-{uuid.uuid4().hex[:8]}", sessions=True)
    outbox = Outbox.open(f"sqlite:///{tmp_path}/o.db")
    events = [Event(type="t.e2e", stream=f"s{i % streams}", data={"i": i}) for i in range(n)]
    outbox.append(events)
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "destinations": {
                "sb": {
                    "transport": "servicebus",
                    "connection_string": env.connection_string,
                    "queue": queue,
                    "sessions": True,
                    "batch_size": 1000,
                    "per_stream": 50,
                    "retry": {"initial_delay": 0.05, "max_delay": 0.5, "max_attempts": 100},
                    **options,
                }
            },
        }
    )
    summary = await Relay(outbox, cfg).run(drain=True)
    outbox.close()
    reader_cfg = ServiceBusConfig(connection_string=env.connection_string, queue=queue, sessions=True)
    reader_t = ServiceBusTransport(reader_cfg)
    async with reader_t.reader(queue) as reader:
        got = await reader.read(n, 30)
    return events, summary, got


async def test_relay_5000_events_50_sessions(tmp_path: Path, servicebus_env: ServiceBusEnv) -> None:
    """5,000 events over 50 streams relayed from SQLite all arrive, in exact order per session."""
    events, summary, got = await _relay_and_read(tmp_path, servicebus_env, 5000)
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert summary.counts["sb"]["delivered"] == 5000
    assert_complete_and_ordered(events, got, exactly_once=False, key_is_stream=True)
    assert len(got) == 5000


async def test_relay_backs_off_on_server_busy(tmp_path: Path, servicebus_env: ServiceBusEnv) -> None:
    """With every 2nd transfer answered com.microsoft:server-busy (5 times) the relay retries and loses nothing."""
    peer = servicebus_env.require_peer("server-busy")
    peer.server_busy(every=2, count=5)
    events, summary, got = await _relay_and_read(
        tmp_path, servicebus_env, 1000, streams=8, busy_retry_after=0.1, batch_size=100
    )
    assert peer.busy_answers == 5
    assert summary.counts["sb"]["retried"] > 0
    assert summary.remaining == 0 and summary.dead_lettered == 0
    assert_complete_and_ordered(events, got, exactly_once=False, key_is_stream=True)
