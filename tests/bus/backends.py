"""The backends the shared subscriber suite runs against, one entry each.

A backend gives the destination options the relay publishes with (and the
bus consumes). ``processes`` says whether members run as separate processes
(every real broker) or as tasks in the test process (the in-process bus).
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from tests.services import need

__all__ = ["BACKENDS", "BusBackend", "make_backend"]

BACKENDS = ("memory", "redis", "nats", "kafka", "rabbitmq")


@dataclasses.dataclass
class BusBackend:
    name: str
    options: dict[str, Any]
    processes: bool = True


def _tag() -> str:
    return uuid.uuid4().hex[:10]


async def make_backend(name: str, request: pytest.FixtureRequest) -> BusBackend:
    """Build the backend ``name`` on its real peer (skips/fails via the peers' fixtures when absent)."""
    if name == "memory":
        return BusBackend(name, {"transport": "memory", "broker": f"bus-{_tag()}"}, processes=False)

    if name == "redis":
        url = request.getfixturevalue("redis_url")
        key = f"outrelay:bus-test:{_tag()}"
        return BusBackend(name, {"transport": "redis", "url": url, "stream": key})

    if name == "nats":
        url = request.getfixturevalue("nats_url")
        tag = _tag()
        stream, subject = f"OR_BUS_{tag}".upper(), f"or.bus.{tag}"
        opts = {
            "transport": "nats",
            "servers": [url],
            "subject": subject + ".{type}",
            "create_stream": {"name": stream, "subjects": [f"{subject}.>"], "storage": "memory"},
            "group_shards": 4,  # share the work between members (the default, 1, keeps one active member)
        }
        return BusBackend(name, opts)

    if name == "kafka":
        from tests.peers.kafka import new_topic

        peer = request.getfixturevalue("kafka_peer")
        topic = await new_topic(peer, "bus", partitions=6)
        return BusBackend(name, {"transport": "kafka", **peer.options(topic)})

    if name == "rabbitmq":
        url = request.getfixturevalue("rabbitmq_url")
        exchange = f"or-bus-{_tag()}"
        opts = {"transport": "rabbitmq", "url": url, "exchange": exchange, "declare_exchange": True}
        return BusBackend(name, opts)

    need(name, "no such bus backend in tests/bus/backends.py")
