"""The least CPU a relay can spend per event at a trickle on this machine: a minimal outbox -> Redis relay.

    .venv/bin/python benchmarks/bench_trickle_floor.py [--rates 100,1000] [--seconds 15] [--modes sync,asyncio,uvloop]
        [--outbox postgresql://127.0.0.1/test]

A child process appends one 256-byte row per transaction at ``rate`` rows a second to a
fresh WAL-mode SQLite file (``synchronous=FULL``, as ``Outbox.append`` commits), like
``bench_latency.py``'s appender. This process relays them to the machine's Redis
(``OUTRELAY_REDIS_URL``, default redis://127.0.0.1:6379/0; a fresh key, deleted afterwards)
doing only what any relay must:

* wait for the append's notice (an inotify watch of the database's directory).
  The notice is the WAL write, which comes before the commit is visible (an
  fsync between): while another process holds SQLite's WAL write lock
  (``F_GETLK``), look again every millisecond, as a relay must when no later
  write would wake it; once the lock is free, look once;
* ``SELECT`` the rows after the last one relayed;
* ``XADD`` each (one write for all of them, then every reply read);
* ``DELETE`` them in one transaction (``synchronous=NORMAL``, as the relay's
  bookkeeping commits), and read the notices of that commit's own writes right
  after it, so that they cost no round (unless another writer holds the lock
  then, or committed meanwhile: ``PRAGMA data_version``).

With ``--outbox postgresql://...`` the rows go to a fresh table of that database, each
append ``INSERT`` + ``NOTIFY`` in one transaction; the relay ``LISTEN``s on a
connection of its own (its socket is what the relay waits on; the notice comes
after the commit, so it looks at once), and runs the ``SELECT`` and the
``DELETE`` on a second connection, blocking, as outrelay's inline calls do.

No routing, leases, lanes, ordering across restarts, retries, envelope, metrics or
logging: everything outrelay does beyond this costs more. Modes: ``sync`` (blocking
calls, no event loop), ``asyncio`` (the same steps in an asyncio loop: the notice a
loop reader, the reply read with ``StreamReader``), ``uvloop`` (that loop on uvloop,
when installed). Prints this process's CPU (user + system) per event and as a share
of one core, to set beside ``bench_latency.py``'s relay CPU at the same rate: a
target below the ``asyncio`` line here cannot be met by a relay built on asyncio,
on this machine.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import select
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from urllib.parse import urlsplit

# the commit watcher's own probes (the same system calls a relay needs), not copies of them
from outrelay.core.stores.sqlite_watch import FAST_STEP, _foreign_writer, _inotify, _open_shm, data_version

REDIS_URL = os.environ.get("OUTRELAY_REDIS_URL", "redis://127.0.0.1:6379/0")
RECHECK = FAST_STEP  # seconds between looks while another process holds the WAL write lock
APPENDER = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("PRAGMA synchronous=FULL")
n, rate = int(sys.argv[2]), float(sys.argv[3])
start = time.monotonic()
for i in range(n):
    wait = start + i / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    db.execute("BEGIN IMMEDIATE")
    db.execute("INSERT INTO outbox(data) VALUES (?)", (b"x" * 256,))
    db.execute("COMMIT")
"""


def resp(*args: bytes) -> bytes:
    """One command in RESP."""
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


class Floor:
    """The relay's state and its steps on a SQLite outbox (shared by the modes)."""

    def __init__(self, path: str, key: bytes) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA synchronous=NORMAL")
        self.key = key
        self.last = 0
        self.done = 0
        fd = _inotify(os.path.dirname(path))
        if fd is None:
            raise SystemExit("bench_trickle_floor: inotify is not available here (Linux only)")
        self.fd = fd
        self.db.execute("SELECT COUNT(*) FROM outbox").fetchone()  # opens the WAL's shared memory file
        shm = _open_shm(path)
        if shm is None:
            raise SystemExit(f"bench_trickle_floor: no shared memory file {path}-shm (not in WAL mode?)")
        self.shm = shm

    def drain(self) -> bool:
        """Read the pending inotify events; True if there were any."""
        seen = False
        try:
            while os.read(self.fd, 65536):
                seen = True
        except BlockingIOError:
            pass
        return seen

    def ready(self) -> list[tuple[int, bytes]] | None:
        """After a notice: the rows after the last one relayed, or None while another process holds
        the WAL write lock (its commit is not visible yet: look again in ``RECHECK``)."""
        self.drain()
        if _foreign_writer(self.shm):
            return None
        return self.db.execute("SELECT seq, data FROM outbox WHERE seq > ?", (self.last,)).fetchall()

    def commands(self, rows: list[tuple[int, bytes]]) -> bytes:
        return b"".join(resp(b"XADD", self.key, b"*", b"data", data) for _, data in rows)

    def settle(self, rows: list[tuple[int, bytes]]) -> bool:
        """Delete the relayed rows; True when the notices read after the commit may be another writer's."""
        self.last = rows[-1][0]
        self.db.execute("BEGIN IMMEDIATE")
        self.db.execute("DELETE FROM outbox WHERE seq <= ?", (self.last,))
        before = data_version(self.db)
        self.db.execute("COMMIT")
        self.done += len(rows)
        return self.drain() and (_foreign_writer(self.shm) or data_version(self.db) != before)

    def close(self) -> None:
        os.close(self.fd)
        os.close(self.shm)
        self.db.close()


PG_APPENDER = """
import sys, time, psycopg
conn = psycopg.connect(sys.argv[1])
table, n, rate = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
start = time.monotonic()
for i in range(n):
    wait = start + i / rate - time.monotonic()
    if wait > 0:
        time.sleep(wait)
    with conn.transaction():
        conn.execute(f"INSERT INTO {table}(data) VALUES (%s)", (b"x" * 256,))
        conn.execute(f"NOTIFY {table}")
"""


class PostgresFloor:
    """The same steps on a PostgreSQL table: ``LISTEN`` on one connection, ``SELECT`` and ``DELETE`` on another."""

    def __init__(self, url: str, table: str, key: bytes) -> None:
        import psycopg  # only for --outbox postgresql://...

        self.db = psycopg.connect(url, autocommit=True)
        self.listener = psycopg.connect(url, autocommit=True)
        self.listener.execute(f"LISTEN {table}")
        self.table, self.key = table, key
        self.fd = self.listener.pgconn.socket
        self.last = 0
        self.done = 0

    def drain(self) -> bool:
        """Read the notices that arrived (``NOTIFY`` comes after its commit)."""
        pgconn, seen = self.listener.pgconn, False
        pgconn.consume_input()
        while pgconn.notifies() is not None:
            seen = True
        return seen

    def ready(self) -> list[tuple[int, bytes]] | None:
        self.drain()
        return self.db.execute(f"SELECT seq, data FROM {self.table} WHERE seq > %s", (self.last,)).fetchall()

    commands = Floor.commands

    def settle(self, rows: list[tuple[int, bytes]]) -> bool:
        self.last = rows[-1][0]
        self.db.execute(f"DELETE FROM {self.table} WHERE seq <= %s", (self.last,))
        self.done += len(rows)
        return False  # a notice that came meanwhile waits on the socket

    def close(self) -> None:
        self.listener.close()
        self.db.close()


def run_sync(floor: Floor | PostgresFloor, host: str, port: int, want: int, until: float) -> None:
    sock = socket.create_connection((host, port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    look = False  # a look is due without a notice
    while floor.done < want and time.monotonic() < until:
        if not look:
            select.select([floor.fd], [], [], 1.0)
        rows = floor.ready()
        if look := rows is None:
            time.sleep(RECHECK)
        if not rows:
            continue
        sock.sendall(floor.commands(rows))
        buf = b""
        while buf.count(b"\r\n") < 2 * len(rows):  # each XADD reply: $<len>\r\n<id>\r\n
            buf += sock.recv(65536)
        look = floor.settle(rows)
    sock.close()


async def run_async(floor: Floor | PostgresFloor, host: str, port: int, want: int, until: float) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    loop = asyncio.get_running_loop()
    notice = asyncio.Event()

    def readable() -> None:
        floor.drain()
        notice.set()

    loop.add_reader(floor.fd, readable)
    look = False  # a look is due without a notice
    try:
        while floor.done < want and time.monotonic() < until:
            if not look:
                try:
                    async with asyncio.timeout(1.0):
                        await notice.wait()
                except TimeoutError:
                    pass
            notice.clear()
            rows = floor.ready()
            if look := rows is None:
                await asyncio.sleep(RECHECK)
            if not rows:
                continue
            writer.write(floor.commands(rows))
            for _ in range(2 * len(rows)):
                await reader.readline()
            look = floor.settle(rows)
    finally:
        loop.remove_reader(floor.fd)
        writer.close()


def measure(mode: str, rate: float, seconds: float, outbox: str | None) -> str:
    url = urlsplit(REDIS_URL)
    host, port = url.hostname or "127.0.0.1", url.port or 6379
    want = int(rate * seconds)
    tag = uuid.uuid4().hex[:10]
    key = f"outrelay-bench:floor:{tag}".encode()
    with tempfile.TemporaryDirectory() as d:
        floor: Floor | PostgresFloor
        if outbox is None:
            path = os.path.join(d, "outbox.db")
            db = sqlite3.connect(path, isolation_level=None)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("CREATE TABLE outbox(seq INTEGER PRIMARY KEY AUTOINCREMENT, data BLOB NOT NULL)")
            db.close()
            floor = Floor(path, key)
            appender = subprocess.Popen([sys.executable, "-c", APPENDER, path, str(want), str(rate)])
        else:
            table = f"outrelay_floor_{tag}"
            floor = PostgresFloor(outbox, table, key)
            floor.db.execute(f"CREATE TABLE {table}(seq BIGSERIAL PRIMARY KEY, data BYTEA NOT NULL)")
            appender = subprocess.Popen([sys.executable, "-c", PG_APPENDER, outbox, table, str(want), str(rate)])
        cpu, started = time.process_time(), time.monotonic()
        until = started + seconds + 15
        try:
            if mode == "sync":
                run_sync(floor, host, port, want, until)
            else:
                runner: Callable[..., None] = asyncio.run
                if mode == "uvloop":
                    import uvloop  # optional: --modes without uvloop skip it

                    runner = uvloop.run
                runner(run_async(floor, host, port, want, until))
        finally:
            cpu, busy = time.process_time() - cpu, time.monotonic() - started
            appender.wait(timeout=30)
            if isinstance(floor, PostgresFloor):
                floor.db.execute(f"DROP TABLE {floor.table}")
            floor.close()
    with socket.create_connection((host, port)) as sock:
        sock.sendall(resp(b"DEL", key))
        sock.recv(100)
    kind = "sqlite" if outbox is None else "postgresql"
    if floor.done < want:
        return f"{kind} {mode} at {rate:.0f} ev/s: only {floor.done} of {want} relayed in time"
    return (
        f"{kind} {mode:>7} at {rate:>5.0f} ev/s: {floor.done} events, CPU {cpu:.2f} s over {busy:.1f} s = "
        f"{100 * cpu / busy:.1f}% of a core, {cpu / floor.done * 1e6:.0f} µs per event"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="100,1000", help="appends per second, comma-separated")
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--modes", default="sync,asyncio,uvloop", help="sync, asyncio, uvloop (comma-separated)")
    ap.add_argument("--outbox", default=None, help="postgresql://... (default: a fresh SQLite file)")
    args = ap.parse_args()
    for rate in (float(r) for r in args.rates.split(",")):
        for mode in args.modes.split(","):
            if mode == "uvloop" and importlib.util.find_spec("uvloop") is None:
                print("uvloop: not installed (pip install uvloop), skipped")
                continue
            print(measure(mode, rate, args.seconds, args.outbox), flush=True)


if __name__ == "__main__":
    main()
