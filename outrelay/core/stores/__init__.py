"""Outbox stores: the database side of outrelay (SQLite built in, PostgreSQL)."""

from outrelay.core.stores.base import (
    Claimed,
    DeadLetter,
    DestinationStatus,
    Settlement,
    Store,
)

__all__ = ["Claimed", "DeadLetter", "DestinationStatus", "Settlement", "Store"]
