"""Versioned SQLite migrations; each entry is applied once, in order, never destructive."""

from __future__ import annotations

MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE outrelay_events (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            id TEXT NOT NULL UNIQUE,
            stream TEXT NOT NULL,
            type TEXT NOT NULL,
            tenant TEXT,
            time REAL NOT NULL,
            attrs BLOB NOT NULL,
            data BLOB NOT NULL,
            routed INTEGER NOT NULL DEFAULT 0
        )""",
        "CREATE INDEX outrelay_events_unrouted ON outrelay_events (seq) WHERE routed = 0",
        "CREATE INDEX outrelay_events_stream ON outrelay_events (stream, seq)",
        """CREATE TABLE outrelay_deliveries (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            destination TEXT NOT NULL,
            stream TEXT NOT NULL,
            event_seq INTEGER NOT NULL REFERENCES outrelay_events (seq),
            attempts INTEGER NOT NULL DEFAULT 0,
            first_attempt_at REAL,
            last_error TEXT,
            created_at REAL NOT NULL
        )""",
        "CREATE INDEX outrelay_deliveries_lane ON outrelay_deliveries (destination, stream, id)",
        "CREATE INDEX outrelay_deliveries_event ON outrelay_deliveries (event_seq)",
        """CREATE TABLE outrelay_lanes (
            destination TEXT NOT NULL,
            stream TEXT NOT NULL,
            due_at REAL NOT NULL,
            pending INTEGER NOT NULL DEFAULT 0,
            parked INTEGER NOT NULL DEFAULT 0,
            owner TEXT,
            PRIMARY KEY (destination, stream)
        )""",
        "CREATE INDEX outrelay_lanes_due ON outrelay_lanes (destination, parked, due_at)",
        """CREATE TABLE outrelay_dead_letters (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            event_seq INTEGER NOT NULL REFERENCES outrelay_events (seq),
            destination TEXT NOT NULL,
            stream TEXT NOT NULL,
            reason TEXT NOT NULL,
            attempts INTEGER NOT NULL,
            first_attempt_at REAL,
            failed_at REAL NOT NULL,
            state TEXT NOT NULL,
            delivery_id INTEGER
        )""",
        "CREATE INDEX outrelay_dead_letters_dest ON outrelay_dead_letters (destination, state, id)",
        "CREATE INDEX outrelay_dead_letters_event ON outrelay_dead_letters (event_seq)",
        """CREATE TABLE outrelay_destinations (
            destination TEXT PRIMARY KEY,
            delivered INTEGER NOT NULL DEFAULT 0,
            last_error TEXT,
            last_error_at REAL,
            disabled TEXT
        )""",
    ),
    # 2: routing by cursor. SQLite has one writer at a time, so sequence order is commit order and
    # "everything above the cursor" cannot skip a late commit (PostgreSQL keeps the routed flag).
    # Rewriting each routed event row (its data included) just to flip a flag cost more than routing.
    (
        "INSERT OR REPLACE INTO outrelay_meta (key, value) "
        "SELECT 'route_cursor', CAST(COALESCE(MAX(seq), 0) AS TEXT) FROM outrelay_events WHERE routed = 1",
    ),
    # 3: no index on deliveries.event_seq. Every routed event paid for it twice (insert, delete);
    # only pruning read it, and pruning now looks the pending sequences up once per run.
    ("DROP INDEX IF EXISTS outrelay_deliveries_event",),
    # 4: replay snapshots, one per (projection name, stream); history reads use outrelay_events_stream
    (
        """CREATE TABLE outrelay_snapshots (
            name TEXT NOT NULL,
            stream TEXT NOT NULL,
            version TEXT NOT NULL,
            seq INTEGER NOT NULL,
            events INTEGER NOT NULL,
            state BLOB NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (name, stream)
        )""",
    ),
    # 5: the audit chain (outrelay.core.history.audit); written only with [audit] enabled = true
    (
        """CREATE TABLE outrelay_audit (
            seq INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            kind TEXT NOT NULL,
            actor TEXT NOT NULL,
            details TEXT NOT NULL,
            prev_hash TEXT NOT NULL,
            hash TEXT NOT NULL,
            mac TEXT
        )""",
        "CREATE INDEX outrelay_audit_kind ON outrelay_audit (kind, seq)",
    ),
    # 6: the delivery-attempt log (outrelay.core.relay.attempts); written only with [attempts] enabled = true
    (
        """CREATE TABLE outrelay_attempts (
            id INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            event_id TEXT NOT NULL,
            event_seq INTEGER NOT NULL,
            destination TEXT NOT NULL,
            stream TEXT NOT NULL,
            attempt INTEGER NOT NULL,
            outcome TEXT NOT NULL,
            latency REAL,
            error TEXT NOT NULL DEFAULT '',
            detail TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX outrelay_attempts_event ON outrelay_attempts (event_seq, id)",
    ),
)
