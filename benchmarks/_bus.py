"""Shared by the bench_subscribe_* scripts: time the full EventBus runtime on pre-published events."""

from __future__ import annotations

import asyncio
import time
import uuid

from outrelay import Event, EventBus, Transport


async def bus_consume(
    transport: Transport,
    count: int,
    *,
    target: str = "",
    prefetch: int = 1024,
    claim_timeout: float = 30.0,
    group: str | None = None,
) -> float:
    """Seconds for one new group member of an :class:`EventBus` (``from_beginning``) to hand
    ``count`` already-stored events to a handler that only counts, from when ``subscribe``
    returned (the receive loop starts then; a group join is not timed)."""
    done = asyncio.Event()
    seen = 0

    async def handler(_: Event) -> None:
        nonlocal seen
        seen += 1
        if seen >= count:
            done.set()

    bus = EventBus(transport, dead_letters="memory", claim_timeout=claim_timeout)
    try:
        name = group or f"bus-{uuid.uuid4().hex[:8]}"
        await bus.subscribe(handler, group=name, target=target, from_beginning=True, prefetch=prefetch, concurrency=128)
        started = time.perf_counter()
        await asyncio.wait_for(done.wait(), 600)
        return time.perf_counter() - started
    finally:
        for sub in bus.subscriptions:
            await sub.unsubscribe(grace=1)
