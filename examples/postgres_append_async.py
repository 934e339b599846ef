"""Append events in an async psycopg 3 transaction with ``Outbox.aappend``.

python examples/postgres_append_async.py [postgresql://user@host/db]
"""

from __future__ import annotations

import asyncio
import os
import sys

import psycopg

from outrelay import Event, Outbox, Relay
from outrelay.transports.memory import MemoryConfig, MemoryTransport

DEFAULT_URL = "postgresql://postgres@127.0.0.1/test"
URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUTRELAY_POSTGRES_URL", DEFAULT_URL)
SCHEMA = "outrelay_example_async"


async def main() -> None:
    outbox = Outbox.open(URL, schema=SCHEMA)
    async with await psycopg.AsyncConnection.connect(URL) as conn:
        await conn.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.payments (id text PRIMARY KEY)")
        await conn.commit()
        async with conn.transaction():  # the payment row and its event commit together
            await conn.execute(f"INSERT INTO {SCHEMA}.payments (id) VALUES (%s) ON CONFLICT DO NOTHING", ("p-1",))
            await outbox.aappend(Event(type="payment.captured", stream="p-1", data={"amount": 10}), conn=conn)
    relay = Relay(outbox, transports={"ledger": MemoryTransport(MemoryConfig(broker="async-example"))})
    await relay.run(drain=True)
    for msg in MemoryTransport.broker("async-example").all():
        print("delivered", msg.event.type, msg.event.stream, msg.event.json())
    outbox.close()


if __name__ == "__main__":
    asyncio.run(main())
