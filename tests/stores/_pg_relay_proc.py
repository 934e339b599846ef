"""A relay process for the multi-relay tests:
``python -m tests.stores._pg_relay_proc URL NAME SINK_SCHEMA SINK_URL LEASE_SECONDS``.

It drains the PostgreSQL outbox at URL into two destinations, ``a`` and
``b``, whose transport records each delivery as a row of
``<SINK_SCHEMA>.received`` (destination, stream, seq, relay) numbered by a
bigserial. Inserting commits before the relay settles, so that number orders
deliveries across processes exactly as they happened. It prints ``ready``
once built, and starts relaying when a line arrives on its stdin.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence

import psycopg

from outrelay import Outbox, Relay
from outrelay.core.config.config import OutrelayConfig, RelayConfig
from outrelay.core.contract.transport import Capabilities, Delivered, Message, SendResult, Transport, TransportConfig


class SinkConfig(TransportConfig):
    url: str
    schema_name: str
    relay: str


class PgSink(Transport):
    """Records deliveries in a PostgreSQL table (the shared, ordered witness)."""

    name = "pgsink"
    Config = SinkConfig

    def __init__(self, config: SinkConfig, *, destination: str) -> None:
        super().__init__(config, destination=destination)
        self.cfg = config
        self.conn: psycopg.AsyncConnection | None = None

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(ordered_batches=True, max_batch_count=1000)

    async def open(self) -> None:
        self.conn = await psycopg.AsyncConnection.connect(self.cfg.url, autocommit=True)

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        assert self.conn is not None
        rows = [(self.destination, m.event.stream, m.event.sequence, self.cfg.relay) for m in batch]
        async with self.conn.cursor() as cur:
            await cur.executemany(
                f'INSERT INTO "{self.cfg.schema_name}".received (destination, stream, seq, relay) '
                "VALUES (%s, %s, %s, %s)",
                rows,
            )
        return [Delivered() for _ in batch]

    async def close(self) -> None:
        if self.conn is not None:
            await self.conn.close()
            self.conn = None


async def main(url: str, name: str, sink_schema: str, admin_url: str, lease: str) -> None:
    # default destination options (batch 100, 16 per stream, 4 in flight); a short lease for takeover tests
    relay_cfg = RelayConfig(poll_interval=0.2, lease_seconds=float(lease), route_batch=2000, drain_retry_bound=5)
    config = OutrelayConfig(relay=relay_cfg)
    sink = SinkConfig(url=admin_url, schema_name=sink_schema, relay=name)
    outbox = Outbox.open(url)
    relay = Relay(outbox, config, transports={d: PgSink(sink, destination=d) for d in ("a", "b")})
    print("ready", flush=True)
    sys.stdin.readline()  # the test starts every relay at once (imports take a second, unevenly)
    summary = await relay.run(drain=True)
    outbox.close()
    print("done", {d: c["delivered"] for d, c in summary.counts.items()}, flush=True)


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:6]))
