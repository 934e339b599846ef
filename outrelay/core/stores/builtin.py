"""Registers the built-in stores (a plugin like any other)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from outrelay.core.config.hookspecs import hookimpl

if TYPE_CHECKING:
    from outrelay.core.config.registry import Registry


@hookimpl
def outrelay_add_stores(registry: Registry) -> None:
    registry.add_store("sqlite", "outrelay.core.stores.sqlite:SQLiteStore")
    registry.add_store("postgresql", "outrelay.core.stores.postgres:PostgresStore")
    registry.add_store("postgres", "outrelay.core.stores.postgres:PostgresStore")
