"""Versioned PostgreSQL migrations for the outbox, in a configurable schema
and with a configurable table prefix.

Each migration is applied once, in order, in one transaction, and recorded in
``<schema>.<prefix>migrations`` (version, name, applied_at). Migrations are
never destructive: they only create or add. Concurrent openers (several
relays starting at once) serialise on a transaction-scoped advisory lock.

:func:`migration_sql` renders the same statements as a script for a DBA
(``outrelay migrate --sql``); :func:`apply_migrations` runs them.
"""

from __future__ import annotations

import re
from typing import Any

from outrelay.core.model.errors import ConfigError, StoreError

__all__ = ["MIGRATIONS", "Names", "apply_migrations", "migration_sql"]

_IDENT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,40}$")
_PREFIX_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,30}$|^$")

#: (name, statements); ``{schema}`` and ``{p}`` (quoted schema, table prefix) are filled in
MIGRATIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "initial outbox tables",
        (
            """CREATE TABLE {schema}."{p}events" (
                seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                id text NOT NULL UNIQUE,
                stream text NOT NULL,
                type text NOT NULL,
                tenant text,
                time double precision NOT NULL,
                attrs jsonb NOT NULL,
                data bytea NOT NULL,
                routed boolean NOT NULL DEFAULT false
            )""",
            'CREATE INDEX "{p}events_unrouted" ON {schema}."{p}events" (seq) WHERE NOT routed',
            'CREATE INDEX "{p}events_stream" ON {schema}."{p}events" (stream, seq)',
            'CREATE INDEX "{p}events_time" ON {schema}."{p}events" (time) WHERE routed',
            """CREATE TABLE {schema}."{p}deliveries" (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                destination text NOT NULL,
                stream text NOT NULL,
                event_seq bigint NOT NULL REFERENCES {schema}."{p}events" (seq),
                attempts integer NOT NULL DEFAULT 0,
                first_attempt_at double precision,
                last_error text,
                created_at double precision NOT NULL
            ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05)""",
            'CREATE INDEX "{p}deliveries_lane" ON {schema}."{p}deliveries" (destination, stream, id)',
            'CREATE INDEX "{p}deliveries_event" ON {schema}."{p}deliveries" (event_seq)',
            """CREATE TABLE {schema}."{p}lanes" (
                destination text NOT NULL,
                stream text NOT NULL,
                due_at double precision NOT NULL,
                pending integer NOT NULL DEFAULT 0,
                parked boolean NOT NULL DEFAULT false,
                owner text,
                PRIMARY KEY (destination, stream)
            ) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01)""",
            'CREATE INDEX "{p}lanes_due" ON {schema}."{p}lanes" (destination, due_at) WHERE NOT parked',
            """CREATE TABLE {schema}."{p}dead_letters" (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                event_seq bigint NOT NULL REFERENCES {schema}."{p}events" (seq),
                destination text NOT NULL,
                stream text NOT NULL,
                reason text NOT NULL,
                attempts integer NOT NULL,
                first_attempt_at double precision,
                failed_at double precision NOT NULL,
                state text NOT NULL,
                delivery_id bigint
            )""",
            'CREATE INDEX "{p}dead_letters_dest" ON {schema}."{p}dead_letters" (destination, state, id)',
            'CREATE INDEX "{p}dead_letters_event" ON {schema}."{p}dead_letters" (event_seq)',
            """CREATE TABLE {schema}."{p}destinations" (
                destination text PRIMARY KEY,
                delivered bigint NOT NULL DEFAULT 0,
                last_error text,
                last_error_at double precision,
                disabled text
            )""",
            """CREATE TABLE {schema}."{p}relays" (
                owner text PRIMARY KEY,
                started_at double precision NOT NULL
            )""",
        ),
    ),
    (
        "replay snapshots",
        (
            """CREATE TABLE {schema}."{p}snapshots" (
                name text NOT NULL,
                stream text NOT NULL,
                version text NOT NULL,
                seq bigint NOT NULL,
                events bigint NOT NULL,
                state bytea NOT NULL,
                created_at double precision NOT NULL,
                PRIMARY KEY (name, stream)
            )""",
        ),
    ),
    (
        "audit chain",
        (
            """CREATE TABLE {schema}."{p}audit" (
                seq bigint PRIMARY KEY,
                at double precision NOT NULL,
                kind text NOT NULL,
                actor text NOT NULL,
                details text NOT NULL,
                prev_hash text NOT NULL,
                hash text NOT NULL,
                mac text
            )""",
            'CREATE INDEX "{p}audit_kind" ON {schema}."{p}audit" (kind, seq)',
        ),
    ),
    (
        # routing takes events from this small queue instead of flipping events.routed: that update
        # rewrote every 1 KB event row (a dead tuple and new entries in every index per event)
        "routing queue",
        (
            # an event deleted by hand takes its queue entry with it: routing never meets a missing event
            """CREATE TABLE {schema}."{p}unrouted" (
                seq bigint PRIMARY KEY REFERENCES {schema}."{p}events" (seq) ON DELETE CASCADE,
                stream text NOT NULL
            )
            WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05)""",
            """CREATE FUNCTION {schema}."{p}queue_appended"() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                INSERT INTO {schema}."{p}unrouted" (seq, stream) SELECT seq, stream FROM appended WHERE NOT routed;
                RETURN NULL;
            END $$""",
            # every writer's appends are queued, whatever SQL it sends (statement level: one call per insert)
            """CREATE TRIGGER "{p}queue_appended" AFTER INSERT ON {schema}."{p}events"
            REFERENCING NEW TABLE AS appended FOR EACH STATEMENT EXECUTE FUNCTION {schema}."{p}queue_appended"()""",
            """INSERT INTO {schema}."{p}unrouted" (seq, stream)
            SELECT seq, stream FROM {schema}."{p}events" WHERE NOT routed""",
            # retention by age over all events (the partial index on routed covers only routing before v4)
            'CREATE INDEX "{p}events_time_all" ON {schema}."{p}events" (time)',
        ),
    ),
    (
        # the foreign key deliveries.event_seq -> events locked every event row a routing inserted a
        # delivery for (FOR KEY SHARE: a WAL record per event, and a full-page image of every 1 KB
        # event page first touched after a checkpoint): 532 -> 476-496 B of WAL per event relayed, 2,100 ->
        # 521 B across a checkpoint, and a third of the routing statement's time. What it guarded
        # stays guarded: routing inserts deliveries only for events it takes off the queue (whose own
        # key cascades from events), prune deletes only events without deliveries, the replays lock
        # the events they queue (FOR KEY SHARE, as the key did), and this trigger takes an event's
        # deliveries with it when one is deleted by hand (the key refused that delete; a delivery
        # whose event is gone could never be sent, and would keep its lane due forever)
        "deliveries without a foreign key",
        (
            'ALTER TABLE {schema}."{p}deliveries" DROP CONSTRAINT IF EXISTS "{p}deliveries_event_seq_fkey"',
            """CREATE FUNCTION {schema}."{p}events_deleted"() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                DELETE FROM {schema}."{p}deliveries" d USING gone WHERE d.event_seq = gone.seq;
                RETURN NULL;
            END $$""",
            """CREATE TRIGGER "{p}events_deleted" AFTER DELETE ON {schema}."{p}events"
            REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION {schema}."{p}events_deleted"()""",
        ),
    ),
    (
        # written in the settle's transaction only with [attempts] enabled (outrelay.core.relay.attempts)
        "delivery-attempt log",
        (
            """CREATE TABLE {schema}."{p}attempts" (
                id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
                at double precision NOT NULL,
                event_id text NOT NULL,
                event_seq bigint NOT NULL,
                destination text NOT NULL,
                stream text NOT NULL,
                attempt integer NOT NULL,
                outcome text NOT NULL,
                latency double precision,
                error text NOT NULL DEFAULT '',
                detail text NOT NULL DEFAULT ''
            ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_insert_scale_factor = 0.05)""",
            # BRIN: rows arrive in about event order, so a block range covers a narrow span of sequences;
            # keeping it costs next to nothing per insert (a B-tree cost the settle's backend ~10%)
            'CREATE INDEX "{p}attempts_event" ON {schema}."{p}attempts" USING brin (event_seq)',
        ),
    ),
)


class Names:
    """Validated, quoted table names for one (schema, prefix)."""

    def __init__(self, schema: str, prefix: str) -> None:
        if not _IDENT_RE.match(schema):
            raise ConfigError(f"outbox schema {schema!r} must be letters, digits and '_' (max 41, no leading digit)")
        if not _PREFIX_RE.match(prefix):
            raise ConfigError(f"outbox table prefix {prefix!r} must be letters, digits and '_' (at most 31)")
        self.schema_name = schema
        self.prefix = prefix
        self.schema = f'"{schema}"'
        for table in (
            "events",
            "deliveries",
            "lanes",
            "dead_letters",
            "destinations",
            "relays",
            "snapshots",
            "migrations",
            "audit",
            "unrouted",
            "attempts",
        ):
            setattr(self, table, f'"{schema}"."{prefix}{table}"')
        #: the NOTIFY channel appends and routing signal on
        self.channel = f"{schema}.{prefix}events"
        #: advisory-lock keys (hashed in SQL with hashtext)
        self.route_key = f"outrelay route {schema}.{prefix}"
        self.migrate_key = f"outrelay migrate {schema}.{prefix}"
        self.audit_key = f"outrelay audit {schema}.{prefix}"

    events: str
    deliveries: str
    lanes: str
    dead_letters: str
    destinations: str
    relays: str
    snapshots: str
    migrations: str
    audit: str
    unrouted: str
    attempts: str

    def fill(self, stmt: str) -> str:
        return stmt.replace("{schema}", self.schema).replace("{p}", self.prefix)

    def routed(self, seq: str) -> str:
        """SQL true when the event whose sequence is the column ``seq`` is routed: it is
        off the routing queue (schema version 4 on)."""
        return f"NOT EXISTS (SELECT 1 FROM {self.unrouted} u WHERE u.seq = {seq})"


def _bootstrap(n: Names) -> list[str]:
    return [
        f"CREATE SCHEMA IF NOT EXISTS {n.schema}",
        f"CREATE TABLE IF NOT EXISTS {n.migrations} (version integer PRIMARY KEY, name text NOT NULL, "
        "applied_at timestamptz NOT NULL DEFAULT now())",
    ]


def migration_sql(schema: str = "public", prefix: str = "outrelay_", *, from_version: int = 0) -> str:
    """The SQL script that brings an outbox at ``from_version`` (0: none) to
    the latest version, in one transaction, recording each version applied.

    :raises ConfigError: invalid schema or prefix.
    """
    n = Names(schema, prefix)
    lines = [f"-- outrelay outbox schema for {schema}.{prefix}* (versions {from_version + 1}..{len(MIGRATIONS)})"]
    lines.append("BEGIN;")
    lines += [s + ";" for s in _bootstrap(n)]
    for version, (name, stmts) in enumerate(MIGRATIONS[from_version:], start=from_version + 1):
        lines.append(f"-- version {version}: {name}")
        lines += [n.fill(s) + ";" for s in stmts]
        lines.append(f"INSERT INTO {n.migrations} (version, name) VALUES ({version}, '{name}');")
    lines.append("COMMIT;")
    return "\n".join(lines) + "\n"


def current_version(cur: Any, n: Names) -> int:
    cur.execute("SELECT to_regclass(%s)", (n.migrations,))
    if cur.fetchone()[0] is None:
        return 0
    cur.execute(f"SELECT COALESCE(MAX(version), 0) FROM {n.migrations}")
    return int(cur.fetchone()[0])


def apply_migrations(conn: Any, n: Names) -> list[int]:
    """Apply pending migrations on a psycopg connection (autocommit mode) and
    return the versions applied.

    :raises StoreError: the database is at a newer version than this outrelay.
    """
    applied: list[int] = []
    with conn.transaction(), conn.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (n.migrate_key,))
        for stmt in _bootstrap(n):
            cur.execute(stmt)
        version = current_version(cur, n)
        _check_not_newer(version, n)
        for v, (name, stmts) in enumerate(MIGRATIONS[version:], start=version + 1):
            for stmt in stmts:
                cur.execute(n.fill(stmt))
            cur.execute(f"INSERT INTO {n.migrations} (version, name) VALUES (%s, %s)", (v, name))
            applied.append(v)
    return applied


def _check_not_newer(version: int, n: Names) -> None:
    if version > len(MIGRATIONS):
        raise StoreError(
            f"outbox {n.schema_name}.{n.prefix}* has schema version {version}, newer than this outrelay "
            f"({len(MIGRATIONS)}); upgrade outrelay"
        )


def check_version(cur: Any, n: Names) -> int:
    """Current version; raises when it is not the latest (``migrate=false`` opens)."""
    version = current_version(cur, n)
    _check_not_newer(version, n)
    if version < len(MIGRATIONS):
        raise StoreError(
            f"outbox {n.schema_name}.{n.prefix}* is at schema version {version}, this outrelay needs "
            f"{len(MIGRATIONS)}; run `outrelay migrate` (or open with migrate=true)"
        )
    return version
