"""Append events in a SQLAlchemy 2.x ``Session`` and ``AsyncSession`` transaction.

    python examples/postgres_append_sqlalchemy.py [postgresql://user@host/db]

The append goes through the session's own connection (``text()``), so it
commits or rolls back with ``session.commit()`` / ``session.rollback()``.
Any PostgreSQL driver works (psycopg, psycopg2, asyncpg); AsyncSession needs
``greenlet`` (``pip install "sqlalchemy[asyncio]"``).
"""

from __future__ import annotations

import asyncio
import os
import sys

from sqlalchemy import create_engine, text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

from outrelay import Event, Outbox, Relay
from outrelay.transports.memory import MemoryConfig, MemoryTransport

DEFAULT_URL = "postgresql://postgres@127.0.0.1/test"
URL = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("OUTRELAY_POSTGRES_URL", DEFAULT_URL)
SA_URL = URL.replace("postgresql://", "postgresql+psycopg://", 1)
SCHEMA = "outrelay_example_sa"


def sync_part(outbox: Outbox) -> None:
    engine = create_engine(SA_URL)
    with Session(engine) as session:
        session.execute(text(f"CREATE TABLE IF NOT EXISTS {SCHEMA}.users (name text)"))
        session.execute(text(f"INSERT INTO {SCHEMA}.users VALUES ('ada')"))
        outbox.append(Event(type="user.registered", stream="user-ada", data={"name": "ada"}), conn=session)
        session.commit()
    engine.dispose()


async def async_part(outbox: Outbox) -> None:
    engine = create_async_engine(SA_URL)
    async with AsyncSession(engine) as session:
        await session.execute(text(f"INSERT INTO {SCHEMA}.users VALUES ('bob')"))
        await outbox.aappend(Event(type="user.registered", stream="user-bob", data={"name": "bob"}), conn=session)
        await session.commit()
    await engine.dispose()


async def main() -> None:
    outbox = Outbox.open(URL, schema=SCHEMA)
    sync_part(outbox)
    await async_part(outbox)
    relay = Relay(outbox, transports={"crm": MemoryTransport(MemoryConfig(broker="sa-example"))})
    await relay.run(drain=True)
    for msg in MemoryTransport.broker("sa-example").all():
        print("delivered", msg.event.type, msg.event.stream, msg.event.json())
    outbox.close()


if __name__ == "__main__":
    asyncio.run(main())
