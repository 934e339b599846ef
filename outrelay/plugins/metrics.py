"""Prometheus metrics for a running relay (``outrelay run --metrics-port``).

A plugin like any other: it observes ``outrelay_batch_settled`` (one call per
batch, never per message) and, on each scrape, reads the queue depth, DLQ
size and oldest pending age from the outbox — the same facts as ``outrelay
status``, so every relay process of one PostgreSQL outbox reports them alike.
The same port answers ``/healthz`` and ``/readyz`` (:mod:`outrelay.plugins.health`).

Relay metrics (all labelled by ``destination``)::

    outrelay_published_total          messages the broker confirmed
    outrelay_duplicates_total         ... of which the broker reported as duplicates
    outrelay_failed_total{outcome}    retry | rejected: sends that failed (a message held back,
                                      unsent, behind a failed one of its stream is not counted)
    outrelay_batch_seconds            histogram of send() durations
    outrelay_delivery_latency_seconds histogram, per confirmed message: event time -> broker ack
    outrelay_attempt_seconds{outcome} histogram, per attempted message: the duration of the send
                                      it was part of; outcome delivered | retry | rejected
    outrelay_pending                  deliveries not yet done (queue depth)
    outrelay_dead_letters             dead letters waiting for an operator
    outrelay_oldest_pending_seconds   age of the oldest pending delivery
    outrelay_disabled                 1 when the destination is disabled

    outrelay_failing_seconds          seconds failing (sends or opening) without one success; 0: healthy
    outrelay_breaker_open             1 while the destination's circuit breaker is open (this process's)
    outrelay_breaker_transitions_total{state}  the breaker opened | closed

and, unlabelled by destination, ``outrelay_unrouted_events_total{reason}``: events no
destination matched (``no_route``, ``tenant``), counted by this relay process
(:mod:`outrelay.core.relay.unrouted`).

``outrelay_delivery_latency_seconds`` starts at the event's ``time``: the
envelope time, set when the application created the event just before
appending it (the outbox keeps no separate commit time, so the transaction's
own duration is included; an event given an explicit older ``time``, and
history queued again by ``outrelay replay``, show their full age). It ends
when the transport's ``send`` returned with the broker's confirmation.

Subscriber and replay metrics (present once there is something to report)::

    outrelay_consumed_total{consumer,outcome}   handled | skipped | dead_lettered | parked,
                                                 of subscriptions given to :meth:`Metrics.watch`
    outrelay_consumer_retries_total{consumer}   handler attempts that raised and were retried
    outrelay_consumer_lag_seconds{consumer}     the last handled event's age when it was handled
    outrelay_replays_total                      replays (folds) run in this process
    outrelay_replayed_events_total              events those replays folded

The consumer counters are this process's; a subscriber process serves them
with ``serve_metrics(None, metrics, host, port)``.
"""

from __future__ import annotations

import asyncio
import bisect
import time
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.contract.transport import Delivered, Message, NotSent, Rejected, RetryLater, SendResult
from outrelay.core.history.replay import replay_counts
from outrelay.core.relay.routing import UNROUTED_REASONS
from outrelay.core.stores.base import DestinationStatus
from outrelay.plugins.health import Health

__all__ = ["Metrics", "serve_metrics", "was_not_sent"]

_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
#: delivery latency reaches further: retries back off for minutes
_LATENCY_BUCKETS = (*_BUCKETS, 30.0, 60.0, 300.0, 1800.0, 3600.0)
_CONSUMED = ("handled", "skipped", "dead_lettered", "parked")
#: how transports not yet moved to NotSent begin the error of a message they held back (see was_not_sent)
_NOT_SENT = ("not sent", "held back", "an earlier message with this")


class Metrics:
    """Counters fed by the relay's hooks; :meth:`render` gives the text format."""

    def __init__(self) -> None:
        self.published: dict[str, int] = defaultdict(int)
        self.duplicates: dict[str, int] = defaultdict(int)
        self.failed: dict[tuple[str, str], int] = defaultdict(int)
        self.buckets: dict[str, list[int]] = defaultdict(lambda: [0] * (len(_BUCKETS) + 1))
        self.seconds_sum: dict[str, float] = defaultdict(float)
        self.latency: dict[str, list[int]] = defaultdict(lambda: [0] * (len(_LATENCY_BUCKETS) + 1))
        self.latency_sum: dict[str, float] = defaultdict(float)
        #: (destination, outcome) -> bucket counts / sum of the attempt-latency histogram
        self.attempts: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0] * (len(_LATENCY_BUCKETS) + 1))
        self.attempts_sum: dict[tuple[str, str], float] = defaultdict(float)
        self.breaker_open: dict[str, int] = {}
        self.breaker_transitions: dict[tuple[str, str], int] = defaultdict(int)
        self._watched: list[Any] = []
        self._subscriptions: dict[int, Any] = {}  # every subscription seen, kept so its counts stay in the totals

    @hookimpl
    def outrelay_batch_settled(
        self,
        destination: str,
        messages: Sequence[Message],
        results: Sequence[SendResult],
        elapsed: float,
        timeline: tuple[float, float, float, float, float],
    ) -> None:
        acked = timeline[3]  # send done: the broker's confirmation arrived
        latency, lat_sum = self.latency[destination], 0.0
        delivered = retried = rejected = 0
        for m, r in zip(messages, results, strict=True):
            if isinstance(r, Delivered):
                delivered += 1
                self.published[destination] += 1
                self.duplicates[destination] += int(r.duplicate)
                seconds = max(0.0, acked - m.event.time.timestamp())
                latency[bisect.bisect_left(_LATENCY_BUCKETS, seconds)] += 1
                lat_sum += seconds
            elif isinstance(r, RetryLater):
                if not was_not_sent(r):  # held back behind a failed one of its stream: never attempted
                    retried += 1
            elif isinstance(r, Rejected):
                rejected += 1
        self.latency_sum[destination] += lat_sum
        slot = bisect.bisect_left(_LATENCY_BUCKETS, elapsed)
        for outcome, count in (("delivered", delivered), ("retry", retried), ("rejected", rejected)):
            if count:
                if outcome != "delivered":
                    self.failed[(destination, outcome)] += count
                key = (destination, outcome)
                self.attempts[key][slot] += count
                self.attempts_sum[key] += elapsed * count
        self.buckets[destination][bisect.bisect_left(_BUCKETS, elapsed)] += 1
        self.seconds_sum[destination] += elapsed

    @hookimpl
    def outrelay_breaker_changed(self, destination: str, state: str, reason: str) -> None:
        self.breaker_open[destination] = int(state == "open")
        self.breaker_transitions[(destination, state)] += 1

    def watch(self, source: Any) -> None:
        """Report the consumed events of ``source``: an :class:`~outrelay.core.consumer.bus.EventBus`
        (each of its subscriptions, present and future) or one
        :class:`~outrelay.core.consumer.subscriber.Subscription`. Counts are read at scrape time from
        the subscriptions' own counters, so watching costs nothing per event. A subscription
        that starts and stops between two scrapes of a watched bus is not seen."""
        if hasattr(source, "stats"):
            self._subscriptions[id(source)] = source
        else:
            self._watched.append(source)

    def _consumers(self) -> list[Any]:
        for bus in self._watched:
            for sub in bus.subscriptions:
                self._subscriptions.setdefault(id(sub), sub)
        return sorted(self._subscriptions.values(), key=lambda s: s.consumer)

    def render(
        self,
        status: Sequence[DestinationStatus],
        unrouted: Mapping[str, int] | None = None,
        failing: Mapping[str, float] | None = None,
    ) -> str:
        """The Prometheus text exposition of counters plus ``status`` gauges; a relay also gives its
        ``unrouted`` events per reason (``outrelay_unrouted_events_total``) and, per destination, the
        seconds it has been ``failing`` without one success (``outrelay_failing_seconds``, 0: healthy)."""
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
            _histogram(out, "outrelay_batch_seconds", f'destination="{d}"', _BUCKETS, counts, self.seconds_sum[d])
        family(
            "outrelay_delivery_latency_seconds",
            "histogram",
            "Seconds from an event's time (set at append) to the broker's confirmation, per confirmed message.",
        )
        for d, counts in sorted(self.latency.items()):
            labels = f'destination="{d}"'
            _histogram(out, "outrelay_delivery_latency_seconds", labels, _LATENCY_BUCKETS, counts, self.latency_sum[d])
        family(
            "outrelay_attempt_seconds",
            "histogram",
            "Duration of the send each attempted message was part of, by outcome (delivered, retry, rejected).",
        )
        for (d, outcome), counts in sorted(self.attempts.items()):
            labels = f'destination="{d}",outcome="{outcome}"'
            _histogram(
                out, "outrelay_attempt_seconds", labels, _LATENCY_BUCKETS, counts, self.attempts_sum[(d, outcome)]
            )
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
        if failing is not None:
            family(
                "outrelay_failing_seconds",
                "gauge",
                "Seconds a destination has been failing (deliveries or opening) without one success; 0 when healthy.",
            )
            for d, seconds in sorted(failing.items()):
                out.append(f'outrelay_failing_seconds{{destination="{d}"}} {seconds:.3f}')
        if unrouted is not None:
            family("outrelay_unrouted_events_total", "counter", "Events no destination matched (delivered nowhere).")
            for reason in sorted({*UNROUTED_REASONS, *unrouted}):
                out.append(f'outrelay_unrouted_events_total{{reason="{_escape(reason)}"}} {unrouted.get(reason, 0)}')
        family("outrelay_breaker_open", "gauge", "1 while the destination's circuit breaker is open.")
        for s in status:
            out.append(
                f'outrelay_breaker_open{{destination="{s.destination}"}} {self.breaker_open.get(s.destination, 0)}'
            )
        if self.breaker_transitions:
            family("outrelay_breaker_transitions_total", "counter", "Circuit breaker transitions by new state.")
            for (d, state), v in sorted(self.breaker_transitions.items()):
                out.append(f'outrelay_breaker_transitions_total{{destination="{d}",state="{state}"}} {v}')
        consumers = self._consumers()
        if consumers:
            totals: dict[tuple[str, str], int] = defaultdict(int)
            retries: dict[str, int] = defaultdict(int)
            lag: dict[str, float] = defaultdict(float)
            for sub in consumers:
                for outcome in _CONSUMED:
                    totals[(sub.consumer, outcome)] += getattr(sub.stats, outcome)
                retries[sub.consumer] += sub.stats.retries
                lag[sub.consumer] = max(lag[sub.consumer], sub.stats.lag_seconds)
            family("outrelay_consumed_total", "counter", "Events a subscription took off the broker, by outcome.")
            for (c, outcome), v in totals.items():
                out.append(f'outrelay_consumed_total{{consumer="{_escape(c)}",outcome="{outcome}"}} {v}')
            family("outrelay_consumer_retries_total", "counter", "Handler attempts that raised and were retried.")
            for c, v in retries.items():
                out.append(f'outrelay_consumer_retries_total{{consumer="{_escape(c)}"}} {v}')
            family(
                "outrelay_consumer_lag_seconds",
                "gauge",
                "Seconds from the last handled event's time (set at append) to when it was handled.",
            )
            for c, seconds in lag.items():
                out.append(f'outrelay_consumer_lag_seconds{{consumer="{_escape(c)}"}} {seconds:.3f}')
        replays = replay_counts()
        if replays.folds:
            family("outrelay_replays_total", "counter", "Replays (folds of a stream's history) run in this process.")
            out.append(f"outrelay_replays_total {replays.folds}")
            family("outrelay_replayed_events_total", "counter", "Events folded by those replays.")
            out.append(f"outrelay_replayed_events_total {replays.events}")
        return "\n".join(out) + "\n"


def was_not_sent(result: SendResult) -> bool:
    """Whether ``result`` reports a message that was never attempted (:class:`NotSent`: held back
    behind a failed message of its stream, or not started before a deadline or a stop), so that a
    send that failed once is counted once, not once per message behind it. Transports not yet moved
    to :class:`NotSent` say so with a :class:`RetryLater` whose error starts with "not sent", "held
    back" or "an earlier message with this"; those are recognised too."""
    if isinstance(result, NotSent):
        return True
    return isinstance(result, RetryLater) and result.error.startswith(_NOT_SENT)


def _escape(value: str) -> str:
    """A label value in the text format: backslash, quote and newline escaped."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _histogram(
    out: list[str], name: str, labels: str, bounds: Sequence[float], counts: Sequence[int], total: float
) -> None:
    """Append one labelled histogram's cumulative ``_bucket`` lines, ``_sum`` and ``_count``."""
    acc = 0
    for bound, c in zip((*bounds, float("inf")), counts, strict=True):
        acc += c
        le = "+Inf" if bound == float("inf") else repr(bound)
        out.append(f'{name}_bucket{{{labels},le="{le}"}} {acc}')
    out.append(f"{name}_sum{{{labels}}} {total:.6f}")
    out.append(f"{name}_count{{{labels}}} {acc}")


async def serve_metrics(
    relay: Any, metrics: Metrics, host: str, port: int, health: Health | None = None
) -> asyncio.Server:
    """Serve ``GET /metrics``, ``/healthz`` and ``/readyz`` (see :mod:`outrelay.plugins.health`) for
    ``relay`` on ``host:port`` (HTTP/1.0, one request per connection). Without ``health``, one with
    the default stall threshold is registered on the relay's plugin manager.

    ``relay`` may be None in a process that only subscribes: ``/metrics`` then has no outbox
    gauges and ``/readyz`` answers like ``/healthz``.

    :raises OSError: the port cannot be bound.
    """
    if health is None and relay is not None:
        health = Health(relay)
        relay.registry.pm.register(health)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            while (await asyncio.wait_for(reader.readline(), 5)) not in (b"\r\n", b"\n", b""):
                pass
            path = line.split(b" ")[1:2]
            if path == [b"/metrics"]:
                status = await relay.db(relay.store.status, list(relay.transports), time.time()) if relay else []
                report = getattr(relay, "unrouted_report", None)
                unrouted = report.by_reason() if report is not None else None
                failing = {n: w.outage_seconds() or 0.0 for n, w in getattr(relay, "workers", {}).items()}
                body, code = metrics.render(status, unrouted, failing if relay else None).encode(), b"200 OK"
            elif path == [b"/healthz"] or (path == [b"/readyz"] and health is None):
                body, code = b"ok\n", b"200 OK"
            elif path == [b"/readyz"] and health is not None:
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
