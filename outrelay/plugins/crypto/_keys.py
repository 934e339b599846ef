"""Master keys: read from the environment or files, held only as AES-GCM objects.

A key reference is ``env:VAR`` or ``file:/path``. The material is 32 bytes
(AES-256), written as base64 (standard or URL-safe) or hex text, or — in a
file only — as the 32 raw bytes. Generate one with::

    python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"

The raw key bytes live only inside this module's functions and the
``AESGCM`` objects built from them; :class:`Keyring` keeps no copy, and its
``repr`` shows key names only. Every error names the key and its reference
(``env:VAR``, a path), never the material.

:raises ConfigError: an unset variable, an unreadable file, or material that
    does not decode to 32 bytes.
:raises MissingExtraError: ``cryptography`` is not installed.
"""

from __future__ import annotations

import base64
import binascii
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from outrelay.core.model.errors import ConfigError, MissingExtraError

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["INSTALL_HINT", "Keyring", "aesgcm_class", "read_key"]

INSTALL_HINT = "pip install 'outrelay[crypto]'"
KEY_BYTES = 32
_HEX = re.compile(r"^[0-9a-fA-F]{64}$")
_GENERATE = 'generate one with: python -c "import base64, os; print(base64.b64encode(os.urandom(32)).decode())"'


def aesgcm_class() -> type[AESGCM]:
    """The ``AESGCM`` class. :raises MissingExtraError: with the install line."""
    try:
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    except ImportError:
        raise MissingExtraError(
            f"payload encryption ([crypto]) needs the cryptography package, which is not installed: run {INSTALL_HINT}"
        ) from None
    return AESGCM


def _decode(raw: bytes, where: str) -> bytes:
    if len(raw) == KEY_BYTES and not raw.strip().isascii():  # a file holding the raw bytes
        return raw
    text = raw.strip()
    if _HEX.match(text.decode("ascii", "replace")):
        return bytes.fromhex(text.decode("ascii"))
    try:
        key = base64.b64decode(text.replace(b"-", b"+").replace(b"_", b"/"), validate=True)
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(f"{where} is not a 32-byte key in base64 or hex; {_GENERATE}")
    return key


def read_key(name: str, ref: str) -> bytes:
    """The 32 key bytes that ``ref`` (``env:VAR`` / ``file:/path``) points to.

    :raises ConfigError: naming ``crypto.keys.NAME`` and the reference only.
    """
    kind, _, target = ref.partition(":")
    where = f"crypto.keys.{name} ({ref})"
    if kind == "env":
        value = os.environ.get(target)
        if not value:
            raise ConfigError(f"{where}: environment variable {target} is not set; export the key in it")
        return _decode(value.encode("utf-8", "replace"), where)
    if kind == "file":
        try:
            raw = Path(target).read_bytes()
        except OSError as exc:
            raise ConfigError(f"{where}: cannot read the key file: {exc.strerror or type(exc).__name__}") from None
        return _decode(raw, where)
    raise ConfigError(f"crypto.keys.{name} must be env:VAR or file:/path")


class Keyring:
    """Named AES-256-GCM keys; ``current`` is the one that encrypts.

    Build with :meth:`load`. Thread-safe (``AESGCM`` objects are).
    """

    __slots__ = ("_aead", "current")

    def __init__(self, aead: Mapping[str, AESGCM], current: str) -> None:
        self._aead = dict(aead)
        self.current = current

    @classmethod
    def load(cls, refs: Mapping[str, str], current: str) -> Keyring:
        """Read every key of ``refs`` (name -> reference); all errors at once, one line.

        :raises ConfigError: see the module docstring. :raises MissingExtraError: no cryptography.
        """
        aead_cls = aesgcm_class()
        aead: dict[str, AESGCM] = {}
        errors: list[str] = []
        for name, ref in refs.items():
            try:
                aead[name] = aead_cls(read_key(name, ref))
            except ConfigError as exc:
                errors.append(str(exc))
        if errors:
            raise ConfigError("; ".join(errors))
        return cls(aead, current)

    def get(self, name: str) -> AESGCM | None:
        """The key called ``name``, or None when this keyring does not hold it."""
        return self._aead.get(name)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(self._aead)

    def __repr__(self) -> str:
        return f"<Keyring keys={sorted(self._aead)!r} current={self.current!r}>"
