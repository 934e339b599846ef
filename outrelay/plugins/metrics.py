"""Prometheus metrics for a running relay (``outrelay run --metrics-port``).

A plugin like any other: it observes ``outrelay_batch_settled`` (one call per
batch, never per message) and, on each scrape, reads the queue depth, DLQ
size and oldest pending age from the outbox — the same facts as ``outrelay
status``, so every relay process of one PostgreSQL outbox reports them alike.
The same port answers ``/healthz`` and ``/readyz`` (:mod:`outrelay.plugins.health`).

Metric names (all labelled by ``destination``)::

    outrelay_published_total          messages the broker confirmed
    outrelay_duplicates_total         ... of which the broker reported as duplicates
    outrelay_failed_total{outcome}    retry | rejected
    outrelay_batch_seconds            histogram of send() durations
    outrelay_pending                  deliveries not yet done (queue depth)
    outrelay_dead_letters             dead letters waiting for an operator
    outrelay_oldest_pending_seconds   age of the oldest pending delivery
    outrelay_disabled                 1 when the destination is disabled
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

from outrelay.core.hookspecs import hookimpl
from outrelay.core.stores.base import DestinationStatus
from outrelay.core.transport import Delivered, Message, Rejected, RetryLater, SendResult
from outrelay.plugins.health import Health

__all__ = ["Metrics", "serve_metrics"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """Counters fed by the relay's hooks; :meth:`render` gives the text format."""

    def __init__(self) -> None:
        self.published: dict[str, int] = defaultdict(int)
        self.duplicates: dict[str, int] = defaultdict(int)
        self.failed: dict[tuple[str, str], int] = defaultdict(int)
        self.buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(_BUCKETS) + 1))
        self.seconds_sum: dict[str, float] = defaultdict(float)

    @hookimpl
    def outrelay_batch_settled(
        self, destination: str, messages: Sequence[Message], results: Sequence[SendResult], elapsed: float
    ) -> None:
        for r in results:
            if isinstance(r, Delivered):
                self.published[destination] += 1
                self.duplicates[destination] += int(r.duplicate)
            elif isinstance(r, RetryLater):
                self.failed[(destination, "retry")] += 1
            elif isinstance(r, Rejected):
                self.failed[(destination, "rejected")] += 1
        self.buckets[destination][bisect.bisect_left(_BUCKETS, elapsed)] += 1
        self.seconds_sum[destination] += elapsed

    def render(self, status: Sequence[DestinationStatus]) -> str:
        """The Prometheus text exposition of counters plus ``status`` gauges."""
        out: list[str] = []

        def family(name: str, kind: str, help_: str) -> None:
            out.append(f"# HELP {name} {help_}")
            out.append(f"# TYPE {name} {kind}")

        family("outrelay_published_total", "counter", "Messages the broker confirmed.")
        for d, v in sorted(self.published.items()):
            out.append(f'outrelay_published_total{{destination="{d}"}} {v}')
        family("outrelay_duplicates_total", "counter", "Confirmed messages the broker reported as duplicates.")
        for d, v in sorted(self.duplicates.items()):
            out.append(f'outrelay_duplicates_total{{destination="{d}"}} {v}')
        family("outrelay_failed_total", "counter", "Failed message sends by outcome.")
        for (d, outcome), v in sorted(self.failed.items()):
            out.append(f'outrelay_failed_total{{destination="{d}",outcome="{outcome}"}} {v}')
        family("outrelay_batch_seconds", "histogram", "Duration of one transport send() call.")
        for d, counts in sorted(self.buckets.items()):
            acc = 0
            for bound, c in zip((*_BUCKETS, float("inf")), counts, strict=True):
                acc += c
                le = "+Inf" if bound == float("inf") else repr(bound)
                out.append(f'outrelay_batch_seconds_bucket{{destination="{d}",le="{le}"}} {acc}')
            out.append(f'outrelay_batch_seconds_sum{{destination="{d}"}} {self.seconds_sum[d]:.6f}')
            out.append(f'outrelay_batch_seconds_count{{destination="{d}"}} {acc}')
        gauges: list[tuple[str, str, Callable[[DestinationStatus], float]]] = [
            ("outrelay_pending", "Deliveries not yet done (queue depth).", lambda s: s.pending),
            ("outrelay_dead_letters", "Dead letters waiting for an operator.", lambda s: s.dead_lettered),
            (
                "outrelay_oldest_pending_seconds",
                "Age of the oldest pending delivery.",
                lambda s: s.oldest_pending_age or 0,
            ),
            ("outrelay_disabled", "1 when the destination is disabled.", lambda s: 1 if s.disabled else 0),
        ]
        for name, help_, get in gauges:
            family(name, "gauge", help_)
            for s in status:
                out.append(f'{name}{{destination="{s.destination}"}} {get(s):g}')
        return "\n".join(out) + "\n"


async def serve_metrics(
    relay: Any, metrics: Metrics, host: str, port: int, health: Health | None = None
) -> asyncio.Server:
    """Serve ``GET /metrics``, ``/healthz`` and ``/readyz`` (see :mod:`outrelay.plugins.health`) for
    ``relay`` on ``host:port`` (HTTP/1.0, one request per connection). Without ``health``, one with
    the default stall threshold is registered on the relay's plugin manager.

    :raises OSError: the port cannot be bound.
    """
    if health is None:
        health = Health(relay)
        relay.registry.pm.register(health)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            path = line.split(b" ")[1:2]
            if path == [b"/metrics"]:
                status = await relay.db(relay.store.status, list(relay.transports), time.time())
                body, code = metrics.render(status).encode(), b"200 OK"
            elif path == [b"/healthz"]:
                body, code = b"ok\n", b"200 OK"
            elif path == [b"/readyz"]:
                verdict = await health.readiness()
                body = verdict.body().encode()
                code = b"200 OK" if verdict.ready else b"503 Service Unavailable"
            else:
                body, code = b"see /metrics, /healthz or /readyz\n", b"404 Not Found"
            writer.write(
                b"HTTP/1.0 " + code + b"\r\nContent-Type: text/plain; version=0.0.4\r\n"
                b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            await writer.drain()
        except (TimeoutError, ConnectionError, IndexError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(handle, host, port)
