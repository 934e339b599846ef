"""Claim cost against backlog and history size on the PostgreSQL outbox (invariant 8).

    python benchmarks/bench_postgres_claim.py [--big 1000000] [--small 10000] [--drain 10000] [--streams 1000]

Three scenarios, each in a fresh schema, loaded with SQL (generate_series):

* ``small``   — ``--small`` pending deliveries;
* ``big``     — ``--big`` pending deliveries;
* ``history`` — ``--big`` delivered events (their deliveries inserted and
  deleted, then VACUUM ANALYZE as autovacuum would) plus ``--small`` pending.

Then one thread drains ``--drain`` deliveries from each through the store's
real ``claim`` + ``settle`` (batch 100, 16 per stream, no transport), in
``--rounds`` interleaved rounds so that load from other processes hits all
scenarios alike; the median rates and the ratios big/small and
history/small (target: close to 1) are printed.
Uses ``OUTRELAY_POSTGRES_URL`` (default postgresql://postgres@127.0.0.1/test).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import time
from collections.abc import Callable

import psycopg
import psycopg.errors

from outrelay.core.stores.base import Settlement
from outrelay.core.stores.postgres import PostgresStore

URL = os.environ.get("OUTRELAY_POSTGRES_URL", "postgresql://postgres@127.0.0.1:5432/test")


def load(conn: psycopg.Connection, schema: str, events: int, streams: int, pending: int, first: int = 1) -> None:
    """Insert ``events`` routed events (seq from ``first``); the last ``pending`` get a pending delivery."""
    t = f'"{schema}".outrelay_'
    # skip foreign-key triggers while bulk loading consistent data (superuser only; else just slower)
    with contextlib.suppress(psycopg.errors.InsufficientPrivilege):
        conn.execute("SET session_replication_role = replica")
    conn.execute(
        f"INSERT INTO {t}events (id, stream, type, time, attrs, data, routed) "
        "SELECT 'e' || g, 's' || mod(g, %s::bigint), 'bench', extract(epoch from now()), "
        "jsonb_build_object('id', 'e' || g, 'type', 'bench', 'stream', 's' || mod(g, %s::bigint), 'source', 'bench', "
        "'time', '2026-01-01T00:00:00Z', 'event_version', '1', 'content_type', 'application/json'), "
        "'\\x7b7d'::bytea, true FROM generate_series(%s::bigint, %s::bigint) g",
        (streams, streams, first, first + events - 1),
    )
    conn.execute(
        f"INSERT INTO {t}deliveries (destination, stream, event_seq, created_at) "
        f"SELECT 'd', stream, seq, 0 FROM {t}events WHERE seq > %s ORDER BY seq",
        (first + events - 1 - pending,),
    )
    conn.execute(
        f"INSERT INTO {t}lanes (destination, stream, due_at, pending) "
        f"SELECT 'd', stream, 0, count(*) FROM {t}deliveries GROUP BY stream "
        f"ON CONFLICT (destination, stream) DO UPDATE SET pending = {t}lanes.pending + excluded.pending"
    )
    conn.execute("RESET session_replication_role")


def drain(store: PostgresStore, count: int) -> float:
    """Deliveries per second for claiming and settling ``count`` deliveries."""
    done = 0
    started = time.perf_counter()
    while done < count:
        now = time.time()
        got = store.claim("d", limit=100, per_lane=16, owner="bench", lease_seconds=60, now=now)
        if not got:
            break
        store.settle("d", "bench", [Settlement(c.delivery_id, c.event.stream, "delivered") for c in got], now)
        done += len(got)
    return done / (time.perf_counter() - started)


def build(name: str, loader: Callable[[psycopg.Connection, str], None]) -> tuple[PostgresStore, float]:
    """A fresh schema ``bench_<name>`` loaded by ``loader``; returns the store and the setup time."""
    schema = f"bench_{name}"
    with psycopg.connect(URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    store = PostgresStore(f"{URL}?schema={schema}")
    started = time.perf_counter()
    with psycopg.connect(URL, autocommit=True) as conn:
        loader(conn, schema)
        for table in ("events", "deliveries", "lanes"):
            conn.execute(f'VACUUM ANALYZE "{schema}".outrelay_{table}')
    drain(store, 500)  # warm up connections and plans
    return store, time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--big", type=int, default=1_000_000)
    ap.add_argument("--small", type=int, default=10_000)
    ap.add_argument("--drain", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=5, help="interleaved rounds (cancels out load drift)")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--keep", action="store_true", help="keep the bench_* schemas")
    args = ap.parse_args()
    small_n = max(args.small, args.drain + 500)

    def history(conn: psycopg.Connection, schema: str) -> None:
        load(conn, schema, args.big, args.streams, args.big)  # deliver it all: insert, then delete
        conn.execute(f'DELETE FROM "{schema}".outrelay_deliveries')
        conn.execute(f'DELETE FROM "{schema}".outrelay_lanes')
        load(conn, schema, small_n, args.streams, small_n, first=args.big + 1)

    loaders: dict[str, Callable[[psycopg.Connection, str], None]] = {
        "small": lambda c, s: load(c, s, small_n, args.streams, small_n),
        "big": lambda c, s: load(c, s, args.big, args.streams, args.big),
        "history": history,
    }
    stores: dict[str, PostgresStore] = {}
    try:
        for name, loader in loaders.items():
            stores[name], setup = build(name, loader)
            print(f"{name:8} loaded in {setup:6.1f}s", flush=True)
        chunk = args.drain // args.rounds
        rates: dict[str, list[float]] = {name: [] for name in stores}
        for _ in range(args.rounds):
            for name, store in stores.items():
                rates[name].append(drain(store, chunk))
        med = {name: statistics.median(r) for name, r in rates.items()}
        for name, r in rates.items():
            print(
                f"{name:8} drain {args.drain} deliveries in {args.rounds} rounds: median {med[name]:7.0f}/s "
                f"(rounds: {', '.join(f'{x:.0f}' for x in r)})"
            )
        print(f"ratio big/small     = {med['big'] / med['small']:.2f}  ({args.big:,} vs {small_n:,} pending)")
        print(f"ratio history/small = {med['history'] / med['small']:.2f}  ({args.big:,} delivered events of history)")
    finally:
        for name, store in stores.items():
            store.close()
            if not args.keep:
                with psycopg.connect(URL, autocommit=True) as conn:
                    conn.execute(f'DROP SCHEMA IF EXISTS "bench_{name}" CASCADE')


if __name__ == "__main__":
    main()
