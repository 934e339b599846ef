"""Payload stores: where claim-checked event data is kept (a directory, S3, the outbox database).

Every method blocks (call it from a worker thread) and is safe to call from
several threads at once. ``put`` returns only once the bytes are durable, so
a reference is never sent for data a crash could lose; it leaves a key that
is already there alone (the same bytes of the same event are stored once).
Failures are :class:`RetryableError` (the relay retries the batch with
backoff), except what a consumer cannot fix by waiting: a location outside
the store, or a payload that is gone, raise :class:`EventError`.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from abc import ABC, abstractmethod
from pathlib import Path
from urllib.parse import quote, unquote

from outrelay.core.model.errors import ConfigError, EventError, RetryableError, StoreError
from outrelay.core.stores.sidetables import side_table, supports
from outrelay.plugins.claimcheck._reference import KEY_RE

__all__ = ["DirectoryStore", "OutboxStore", "PayloadStore"]


class PayloadStore(ABC):
    """One place payloads go; ``location(key)`` is the ``dataref`` a reference carries."""

    @abstractmethod
    def location(self, key: str) -> str:
        """The URI of ``key`` in this store."""

    @abstractmethod
    def owns(self, location: str) -> bool:
        """Whether ``location`` names a payload of this store (consumers fetch nothing else)."""

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Store ``data`` under ``key`` durably, unless ``key`` is there already.

        :raises RetryableError: the store cannot be written now.
        """

    @abstractmethod
    def get(self, location: str) -> bytes:
        """The bytes at ``location`` (one this store :meth:`owns`).

        :raises EventError: nothing is there (removed by retention, or never stored).
        :raises RetryableError: the store cannot be read now.
        """

    @abstractmethod
    def prune(self, older_than: float) -> int:
        """Delete the payloads stored before ``older_than`` (``time.time()`` seconds), only
        keys outrelay writes; return how many were deleted.

        :raises RetryableError: the store cannot be listed or written now.
        """


class DirectoryStore(PayloadStore):
    """Files in one directory (``file:///absolute/dir``): a local disk, or a volume the consumers mount."""

    def __init__(self, root: str) -> None:
        self.root = Path(os.path.normpath(root))

    def location(self, key: str) -> str:
        return "file://" + quote(str(self.root / key))

    def _path(self, location: str) -> Path | None:
        if not location.startswith("file://"):
            return None
        path = Path(unquote(location[len("file://") :]))
        return path if path.parent == self.root and KEY_RE.match(path.name) else None

    def owns(self, location: str) -> bool:
        return self._path(location) is not None

    def put(self, key: str, data: bytes) -> None:
        target = self.root / key
        if target.exists():
            return
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".partial-")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(data)
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, target)  # readers see the whole file or none
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            dir_fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(dir_fd)  # the rename survives a crash too
            finally:
                os.close(dir_fd)
        except OSError as exc:
            raise RetryableError(f"cannot store a payload in {str(self.root)!r}: {exc.strerror or exc}") from None

    def get(self, location: str) -> bytes:
        path = self._path(location)
        if path is None:
            raise EventError(f"claim-check reference {location!r} is not a payload of {str(self.root)!r}")
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise EventError(f"claim-check payload {location} is gone (removed by retention?)") from None
        except OSError as exc:
            raise RetryableError(f"cannot read claim-check payload {location}: {exc.strerror or exc}") from None

    def prune(self, older_than: float) -> int:
        removed = 0
        try:
            entries = list(os.scandir(self.root))
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise RetryableError(f"cannot list payloads in {str(self.root)!r}: {exc.strerror or exc}") from None
        for entry in entries:
            partial = entry.name.startswith(".partial-")  # left by a crash in put
            if not (KEY_RE.match(entry.name) or partial) or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(FileNotFoundError):
                if entry.stat(follow_symlinks=False).st_mtime < older_than:
                    os.unlink(entry.path)
                    removed += not partial
        return removed

    def __repr__(self) -> str:
        return f"<DirectoryStore {str(self.root)!r}>"


class OutboxStore(PayloadStore):
    """Table ``outrelay_payloads`` of the outbox database (SQLite or PostgreSQL; see
    :mod:`outrelay.core.stores.sidetables`), located as ``outbox:payloads/KEY``."""

    _DDL = "CREATE TABLE IF NOT EXISTS {t} (key TEXT PRIMARY KEY, data {blob} NOT NULL, stored_at {real} NOT NULL)"

    def __init__(self, url: str) -> None:
        if not supports(url):
            scheme = url.split(":", 1)[0]
            raise ConfigError(f"claim_check store = 'outbox' needs a SQLite or PostgreSQL outbox, not a {scheme!r} one")
        self.url = url

    def location(self, key: str) -> str:
        return f"outbox:payloads/{key}"

    def owns(self, location: str) -> bool:
        return location.startswith("outbox:payloads/") and KEY_RE.match(location[16:]) is not None

    def put(self, key: str, data: bytes) -> None:
        try:
            with side_table(self.url, "payloads", create=True) as t:
                assert t is not None
                t.execute(self._DDL.replace("{blob}", t.blob).replace("{real}", t.real))
                t.execute(
                    "INSERT INTO {t} (key, data, stored_at) VALUES (?, ?, ?) ON CONFLICT (key) DO NOTHING",
                    (key, data, time.time()),
                )
        except StoreError as exc:
            raise RetryableError(f"cannot store a payload in the outbox: {exc}") from None

    def get(self, location: str) -> bytes:
        if not self.owns(location):
            raise EventError(f"claim-check reference {location!r} is not a payload of the outbox")
        try:
            with side_table(self.url, "payloads", create=False) as t:
                row = t.execute("SELECT data FROM {t} WHERE key = ?", (location[16:],)).fetchone() if t else None
        except StoreError as exc:
            if "no such table" in str(exc) or "does not exist" in str(exc):
                row = None
            else:
                raise RetryableError(f"cannot read claim-check payload {location}: {exc}") from None
        if row is None:
            raise EventError(f"claim-check payload {location} is gone (removed by retention?)")
        return bytes(row[0])

    def prune(self, older_than: float) -> int:
        try:
            with side_table(self.url, "payloads", create=False) as t:
                if t is None or not t.exists():
                    return 0
                return int(t.execute("DELETE FROM {t} WHERE stored_at < ?", (older_than,)).rowcount)
        except StoreError as exc:
            raise RetryableError(f"cannot prune payloads in the outbox: {exc}") from None

    def __repr__(self) -> str:
        return "<OutboxStore>"
