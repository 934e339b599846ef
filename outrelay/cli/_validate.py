"""Validation before side effects, shared by the commands.

* :func:`validate` — what ``run`` checks before it creates or connects to
  anything, and ``check`` (``--offline`` too) checks alike: every
  destination's transport and options (addresses included, see
  :mod:`outrelay.core.config.endpoints`) and the keys the config points at. Any
  problem is a :class:`ConfigError` (exit 2) naming the file, and nothing was
  created.
* :func:`outbox_problem` — why a SQLite outbox cannot be opened or created
  (a directory that is missing or not writable, a file that is not a SQLite
  database), said before SQLite's own ``unable to open database file``.
* :func:`open_existing` — the outbox of operator commands (``status``,
  ``dlq``, ``audit``, ``replay`` ...), which read or change an outbox that a
  relay or an application created: a mistyped path is an error, never a new
  empty outbox reported healthy.
* :func:`permanent` — whether an outbox error at start is one that waiting
  does not cure (so ``run`` fails at once instead of retrying it as an outage).
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from outrelay.core.config.config import OutrelayConfig
from outrelay.core.contract.transport import Transport
from outrelay.core.model.errors import ConfigError, StoreError
from outrelay.core.stores.outbox import Outbox

__all__ = ["open_existing", "outbox_problem", "permanent", "validate"]

#: PostgreSQL answers that do not change by waiting (a server that is starting or down does)
_PG_PERMANENT = ("does not exist", "password authentication failed", "no pg_hba.conf entry", "permission denied")


def validate(cfg: OutrelayConfig) -> dict[str, Transport]:
    """Build (without I/O) every destination's transport and read the keys the config points
    at; returns the transports. Callers prefix errors with the file (``config_context``).

    :raises ConfigError: no destination; an unknown transport, a missing extra, an invalid
        option or address — every destination's problems in one line; an unreadable key.
    """
    from outrelay.core.config.registry import get_registry
    from outrelay.core.relay.relay import build_transports
    from outrelay.plugins.crypto import PayloadCrypto, crypto_config

    if not cfg.destinations:
        raise ConfigError("no destinations configured; add a [destinations.NAME] table")
    transports = build_transports(cfg, get_registry())
    if crypto_config(cfg) is not None:
        PayloadCrypto.from_config(cfg)  # reads every key, as the relay does when it starts
    if cfg.audit.enabled and cfg.audit.hmac_key:
        from outrelay.core.history.audit import resolve_key

        resolve_key(cfg.audit.hmac_key)
    return transports


def outbox_problem(url: str, *, create: bool) -> str | None:
    """Why the SQLite outbox at ``url`` cannot be opened (or, with ``create``, created), or None.
    Other stores: None (their server answers for them)."""
    if not url.startswith("sqlite:///"):
        return None
    path = Path(url[len("sqlite:///") :])
    if not str(path) or str(path) == ":memory:":
        return None  # the store's own message says what to write
    parent = path.parent
    if not path.exists():
        if not create:
            return (
                f"no outbox at {str(path)!r} (outbox.url {url}): check the path, or create the outbox with "
                "`outrelay migrate` (`outrelay run` creates it too)"
            )
        if not parent.is_dir():
            what = "does not exist" if not parent.exists() else "is not a directory"
            return f"cannot create the outbox {str(path)!r}: {str(parent)!r} {what}"
        if not os.access(parent, os.W_OK | os.X_OK):
            who = f"this user (uid {os.getuid()})"
            return f"cannot create the outbox {str(path)!r}: {who} may not write {str(parent)!r}"
        return None
    if not path.is_file():
        return f"the outbox {str(path)!r} is not a file"
    if not os.access(path, os.R_OK | os.W_OK):
        return f"this user (uid {os.getuid()}) may not read and write the outbox {str(path)!r}"
    if not os.access(parent, os.W_OK | os.X_OK):  # SQLite keeps its -wal and -shm files next to it
        return f"this user (uid {os.getuid()}) may not write {str(parent)!r}, where SQLite keeps the outbox's journal"
    tables = _has_outbox_tables(path)
    if tables is None:
        return f"{str(path)!r} is not a SQLite database (outbox.url {url})"
    if not create and not tables:
        return f"{str(path)!r} is a SQLite database without an outbox (no outrelay tables): check outbox.url"
    return None


def _has_outbox_tables(path: Path) -> bool | None:
    """Whether the SQLite database ``path`` has the outbox's tables; None: not a SQLite database.

    Read through SQLite, never with a plain ``open()``: closing a file descriptor of a database drops
    every POSIX lock this process holds on it, which lets another process checkpoint the WAL under
    this process's connections and corrupt the database (sqlite.org/howtocorrupt.html, 2.2)."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        try:
            return db.execute("SELECT 1 FROM sqlite_master WHERE name = 'outrelay_events'").fetchone() is not None
        finally:
            db.close()
    except sqlite3.DatabaseError as exc:
        return None if "not a database" in str(exc) else True  # other errors: the store says what is wrong
    except sqlite3.Error:
        return True


def open_existing(cfg: OutrelayConfig, where: str | None = None) -> Outbox:
    """The outbox of ``cfg`` for an operator command: it must exist already.

    :raises ConfigError: a SQLite outbox that is not there (or not an outbox); a PostgreSQL
        database without outrelay's tables. :raises StoreError: the database failed.
    """
    url = cfg.outbox.url
    problem = outbox_problem(url, create=False)
    if problem:
        raise ConfigError(problem, where=where)
    if url.startswith(("postgresql:", "postgres:")):
        _pg_must_exist(url, where)
    return Outbox.open(url, max_event_bytes=cfg.outbox.max_event_bytes)


def _pg_must_exist(url: str, where: str | None) -> None:
    try:
        from outrelay.core.stores.postgres_pool import connect, parse_url
    except ImportError:
        return  # Outbox.open says which extra to install
    conninfo, opts = parse_url(url, {})
    conn = connect(conninfo, url.split("@")[-1])
    try:
        table = f'"{opts["schema"]}"."{opts["prefix"]}events"'
        found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    finally:
        conn.close()
    if found is None or found[0] is None:
        raise ConfigError(
            f"no outbox in this PostgreSQL database (no table {table}): check outbox.url, or create it with "
            "`outrelay migrate`",
            where=where,
        )


def permanent(exc: StoreError, url: str) -> bool:
    """Whether an error opening the outbox at start stays until someone acts: any for a SQLite
    file (a local file does not start up later), and refusals for PostgreSQL."""
    if url.startswith("sqlite:"):
        return True
    text = str(exc)
    return any(marker in text for marker in _PG_PERMANENT)
