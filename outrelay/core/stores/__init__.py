"""The outbox and its stores: ``Outbox`` (what applications append with), the store contract
split by role, the SQLite and PostgreSQL stores, and the side tables features keep next
to the outbox.

May import from outrelay.core: model, config.
"""

from outrelay.core.stores.base import (
    Claimed,
    DeadLetter,
    DestinationStatus,
    Settlement,
    Store,
)

__all__ = ["Claimed", "DeadLetter", "DestinationStatus", "Settlement", "Store"]
