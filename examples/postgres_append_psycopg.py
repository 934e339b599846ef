"""Append events in your own psycopg 3 transaction, then relay them.

    python examples/postgres_append_psycopg.py [postgresql://user@host/db]

The order row and its event commit together or not at all: the second
transaction fails after appending, and its event is never delivered.
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
SCHEMA = "outrelay_example"


def place_order(outbox: Outbox, conn: psycopg.Connection, order_id: int, fail: bool = False) -> None:
    with conn.transaction():  # one transaction: the application's state and its events
        conn.execute(f"INSERT INTO {SCHEMA}.orders (id, total) VALUES (%s, %s)", (order_id, 42))
        outbox.append(Event(type="order.placed", stream=f"order-{order_id}", data={"id": order_id}), conn=conn)
        if fail:
            raise psycopg.Rollback()  # e.g. a validation error after the append: both are undone


async def main() -> None:
    outbox = Outbox.open(URL, schema=SCHEMA)  # creates/migrates outrelay's tables in SCHEMA
    with psycopg.connect(URL) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.orders (id int PRIMARY KEY, total int)")
        conn.execute(f"TRUNCATE {SCHEMA}.orders")
        conn.commit()
        place_order(outbox, conn, 1)
        place_order(outbox, conn, 2, fail=True)
    relay = Relay(outbox, transports={"shop": MemoryTransport(MemoryConfig(broker="example"))})
    await relay.run(drain=True)
    for msg in MemoryTransport.broker("example").all():
        print("delivered", msg.event.type, msg.event.stream, msg.event.json())
    outbox.close()


if __name__ == "__main__":
    asyncio.run(main())
