"""A settled batch wakes its waiting worker only when the store knows something came due: a retry due
sooner than the worker's wait is still claimed on time (the settle lowered what the store knew)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from outrelay import Event, Outbox, Relay, parse_config
from outrelay.transports.memory import MemoryTransport


async def test_a_retry_due_before_the_poll_is_claimed_on_time(tmp_path: Path) -> None:
    """poll_interval 5 s, one retryable failure, the retry due 0.2 s later: delivered well before the poll
    (a worker left asleep after that batch would wait the whole poll interval)."""
    broker = MemoryTransport.broker("wake-after-batch")
    broker.clear()
    cfg = parse_config(
        {
            "outbox": {"url": f"sqlite:///{tmp_path}/o.db"},
            "relay": {"poll_interval": 5.0},
            "destinations": {
                "mem": {
                    "transport": "memory",
                    "broker": "wake-after-batch",
                    "retry": {"initial_delay": 0.2, "max_delay": 0.2, "jitter": 0.0},
                }
            },
        }
    )
    relay = Relay(config=cfg)
    task = asyncio.create_task(relay.run())
    other = Outbox.open(cfg.outbox.url)  # another connection: the relay hears of it through its watcher
    try:
        await asyncio.sleep(0.3)
        broker.fail_next = 1
        started = time.monotonic()
        await asyncio.to_thread(other.append, Event(type="t.x", stream="s", data={"i": 1}))
        while not broker.all() and time.monotonic() - started < 8.0:
            await asyncio.sleep(0.01)
        took = time.monotonic() - started
        assert len(broker.all()) == 1, "not delivered"
        assert broker.fail_next == 0  # the first attempt failed: this is the retry
        assert took < 2.5, f"the retry waited {took:.2f} s (poll_interval 5 s)"
    finally:
        other.close()
        relay.stop()
        await task
