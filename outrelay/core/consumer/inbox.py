"""Idempotent handling: an inbox of handled event ids in the application's database.

Brokers deliver at least once, so a handler may see an event again (after a
member crashed between committing its effects and acking). The inbox makes
that harmless: record the event id **in the same transaction as the
handler's effects**; a redelivered event finds its id and is skipped —
exactly when its effects were committed::

    inbox = Inbox("billing")                       # one name per consumer (group)
    inbox.create_table(conn)                       # once (idempotent)

    def on_paid(event):                            # runs in a worker thread
        with sqlite3.connect("app.db") as conn:    # the app's own transaction
            if not inbox.claim(conn, event):
                return                             # effects already committed
            conn.execute("UPDATE invoices SET paid = 1 WHERE order_id = ?", (event.stream,))

``claim`` works with a ``sqlite3`` connection, a psycopg ``Connection``
and a SQLAlchemy ``Session``/``Connection``; ``aclaim`` with a psycopg
``AsyncConnection`` or a SQLAlchemy ``AsyncSession``/``AsyncConnection``.
The caller commits (or rolls back: then the id is not recorded either and a
redelivery is handled again). Rows are ``(consumer, event_id, handled_at)``;
:meth:`Inbox.prune` deletes old ones.
"""

from __future__ import annotations

import re
import time
from typing import Any

from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError
from outrelay.core.stores._caller_tx import Driver, arun, driver, run

__all__ = ["Inbox"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")


class Inbox:
    """Handled event ids of one consumer, in table ``table`` of the app's database."""

    def __init__(self, consumer: str, *, table: str = "outrelay_inbox") -> None:
        if not _NAME.match(table):
            raise ConfigError(f"inbox table name {table!r} must be a plain SQL identifier (letters, digits, '_')")
        self.consumer = consumer
        self.table = table

    # -- dialect plumbing ---------------------------------------------------

    @staticmethod
    def _kind(conn: Any) -> Driver:
        kind = driver(conn)
        if kind is not None:
            return kind
        raise ConfigError(
            f"Inbox: unsupported connection {type(conn).__name__}; "
            "use sqlite3, psycopg or a SQLAlchemy Session/Connection"
        )

    def _ddl(self) -> str:
        # DOUBLE PRECISION has REAL affinity in SQLite: one statement for both databases
        return (
            f"CREATE TABLE IF NOT EXISTS {self.table} (consumer TEXT NOT NULL, event_id TEXT NOT NULL, "
            "handled_at DOUBLE PRECISION NOT NULL, PRIMARY KEY (consumer, event_id))"
        )

    def _insert(self) -> str:
        # ON CONFLICT DO NOTHING: SQLite >= 3.24 and PostgreSQL; the row count says whether it is new
        return f"INSERT INTO {self.table} (consumer, event_id, handled_at) VALUES (%s, %s, %s) ON CONFLICT DO NOTHING"

    # -- sync ---------------------------------------------------------------

    def create_table(self, conn: Any) -> None:
        """Create the inbox table if it does not exist (in ``conn``'s transaction)."""
        kind = self._kind(conn)
        run(kind, conn, self._ddl(), ())

    def claim(self, conn: Any, event: Event | str) -> bool:
        """Record ``event`` as handled in ``conn``'s open transaction.

        :returns: True the first time (go on with the effects), False when it
            was already recorded (a redelivery: skip the effects).
        """
        kind = self._kind(conn)
        event_id = event.id if isinstance(event, Event) else event
        return int(run(kind, conn, self._insert(), (self.consumer, event_id, time.time()))) == 1

    def handled(self, conn: Any, event: Event | str) -> bool:
        """Whether ``event`` was recorded (read only)."""
        kind = self._kind(conn)
        event_id = event.id if isinstance(event, Event) else event
        sql = f"SELECT 1 FROM {self.table} WHERE consumer = %s AND event_id = %s"
        return run(kind, conn, sql, (self.consumer, event_id), first=True) is not None

    def prune(self, conn: Any, older_than: float) -> int:
        """Delete ids handled before ``older_than`` (Unix seconds); keep them longer than
        any redelivery can take (the broker's retention). Returns the count."""
        kind = self._kind(conn)
        sql = f"DELETE FROM {self.table} WHERE consumer = %s AND handled_at < %s"
        return int(run(kind, conn, sql, (self.consumer, older_than)))

    # -- async --------------------------------------------------------------

    async def acreate_table(self, conn: Any) -> None:
        """:meth:`create_table` on a psycopg AsyncConnection or SQLAlchemy async session/connection."""
        await self._aexecute(conn, self._ddl(), ())

    async def aclaim(self, conn: Any, event: Event | str) -> bool:
        """:meth:`claim` on a psycopg AsyncConnection or SQLAlchemy async session/connection."""
        event_id = event.id if isinstance(event, Event) else event
        return await self._aexecute(conn, self._insert(), (self.consumer, event_id, time.time())) == 1

    async def _aexecute(self, conn: Any, sql: str, args: tuple[Any, ...]) -> int:
        count = await arun(self._kind(conn), conn, sql, args)
        if count is not None:
            return count
        raise ConfigError("Inbox.aclaim takes an async connection (psycopg AsyncConnection or SQLAlchemy async)")

    def __repr__(self) -> str:
        return f"<Inbox consumer={self.consumer!r} table={self.table!r}>"
