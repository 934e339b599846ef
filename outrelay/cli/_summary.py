"""What ``outrelay run`` says at start and at the end: one log line, one summary."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from outrelay._version import __version__
from outrelay.cli._common import mask, secrets_of
from outrelay.core.config.config import OutrelayConfig
from outrelay.core.contract.transport import Transport
from outrelay.core.relay.relay import RunSummary

__all__ = ["startup_line", "summary_doc", "summary_line"]


def startup_line(cfg: OutrelayConfig, transports: Mapping[str, Transport], metrics_url: str | None) -> str:
    """``outrelay VERSION starting: outbox URL; destinations: a (webhook), ...`` — the outbox
    password and every secret-looking option value masked."""
    dests = ", ".join(f"{name} ({t.name})" for name, t in sorted(transports.items()))
    used = ", ".join(sorted({t.name for t in transports.values()}))
    line = f"outrelay {__version__} starting: outbox {cfg.outbox.url}; destinations: {dests}; transports: {used}"
    if metrics_url:
        line += f"; metrics, /healthz, /readyz on {metrics_url}"
    return mask(line, secrets_of(cfg)) or ""


def summary_doc(summary: RunSummary) -> dict[str, Any]:
    """The run's totals and per-destination counts, as plain JSON-able values. Parked events
    (their stream stopped, waiting for an operator) are counted apart from dead-lettered ones
    (set aside while the stream went on); ``unrouted`` counts, per reason, events that no
    destination matched (delivered nowhere, see :mod:`outrelay.core.relay.unrouted`)."""
    counts = summary.counts
    return {
        "delivered": sum(c["delivered"] for c in counts.values()),
        "dead_lettered": sum(c["dead_lettered"] for c in counts.values()),
        "parked": sum(c["parked"] for c in counts.values()),
        "pending": summary.remaining,
        "unrouted": dict(summary.unrouted),
        "elapsed": round(summary.elapsed, 3),
        "destinations": {name: dict(c) for name, c in sorted(counts.items())},
    }


def summary_line(doc: dict[str, Any]) -> str:
    """The one-line text summary of :func:`summary_doc`'s ``doc``."""
    line = (
        f"delivered {doc['delivered']} in {doc['elapsed']:.1f}s; {doc['pending']} pending; "
        f"{doc['dead_lettered']} dead-lettered; {doc['parked']} parked"
    )
    nowhere = sum(doc["unrouted"].values())
    if nowhere:
        reasons = ", ".join(f"{r}: {n}" for r, n in sorted(doc["unrouted"].items()))
        line += f"; {nowhere} routed nowhere ({reasons}; see `outrelay status`)"
    return line
