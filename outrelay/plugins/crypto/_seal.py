"""Sealing and opening one event's data: AES-256-GCM envelope encryption.

Each :class:`Sealer` (one per relay batch, or per ``append`` call) draws a
fresh 256-bit data key (DEK) and wraps it once with the named master key;
every event it seals is encrypted with the DEK under a 96-bit counter nonce
(unique per DEK: the DEK is random and never reused across sealers). The
sealed data is self-contained::

    0x01                      format version
    12 B  wrap nonce          random
    48 B  wrapped DEK         AES-GCM(master, wrap nonce, DEK, aad="outrelay/dek/v1" 0x00 keyid)
    12 B  data nonce          counter within this DEK
    ...   ciphertext + 16 B   AES-GCM(DEK, data nonce, inner, aad=id 0x00 type 0x00 stream)
    inner = 2 B big-endian length of the original content type (0: none) | content type | data

The event keeps its id, type, stream, tenant and every other attribute in
clear (routing and ordering need them); it gets content type
:data:`ENCRYPTED_CONTENT_TYPE` and metadata ``keyid`` = the master key's
name, which every transport carries as the CloudEvents extension ``keyid``.
The AAD binds the ciphertext to its event: moved onto another event (other
id, type or stream) it no longer decrypts. Overhead: 91 bytes plus the
original content type's length per event.

:raises EventError: (opening) a key this process does not hold, altered or
    moved data, or data that is not a sealed payload.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from outrelay.core.model._draft import copier
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError
from outrelay.plugins.crypto._keys import Keyring, aesgcm_class

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

__all__ = ["ENCRYPTED_CONTENT_TYPE", "KEYID", "Opener", "Sealer", "is_sealed"]

#: content type of sealed data (the original one travels inside the ciphertext)
ENCRYPTED_CONTENT_TYPE = "application/vnd.outrelay.encrypted+octet-stream"
#: metadata key (and CloudEvents extension attribute) naming the master key
KEYID = "keyid"
_VERSION = b"\x01"
_HEADER = 1 + 12 + 48  # version, wrap nonce, wrapped DEK
_MIN_LEN = _HEADER + 12 + 16 + 2
_DEK_CACHE = 1024


#: copy(event, data, content_type, metadata): ``metadata`` must be read-only (a MappingProxyType)
_copy: Callable[[Event, bytes, str | None, Mapping[str, str]], Event] = copier(
    Event, "data", "content_type", "metadata"
)


def is_sealed(event: Event) -> bool:
    """True when ``event``'s data is a sealed payload (by its content type)."""
    return event.content_type == ENCRYPTED_CONTENT_TYPE


@functools.lru_cache(maxsize=256)
def _prefix(content_type: str | None) -> bytes:
    """The start of the sealed plaintext: the content type's length (2 bytes) and the content type."""
    ctype = (content_type or "").encode()
    return len(ctype).to_bytes(2, "big") + ctype


def _aad(event: Event) -> bytes:
    # id is printable ASCII, type has no NUL and stream refuses control characters: 0x00 separates safely
    return f"{event.id}\x00{event.type}\x00{event.stream}".encode()


def _wrap_aad(keyid: str) -> bytes:
    return b"outrelay/dek/v1\x00" + keyid.encode()


class Sealer:
    """Seals events with one fresh data key wrapped by the keyring's current key."""

    __slots__ = ("_aead", "_header", "_keyid", "_meta", "_n")

    def __init__(self, keyring: Keyring) -> None:
        keyid = keyring.current
        master = keyring.get(keyid)
        assert master is not None  # CryptoConfig checks encrypt_with names a key
        dek = os.urandom(32)
        wrap_nonce = os.urandom(12)
        self._header = _VERSION + wrap_nonce + master.encrypt(wrap_nonce, dek, _wrap_aad(keyid))
        self._aead = aesgcm_class()(dek)
        self._keyid = keyid
        self._meta = MappingProxyType({KEYID: keyid})  # shared by the events without metadata of their own
        self._n = 0

    def seal(self, event: Event) -> Event:
        """``event`` with its data sealed (see the module docstring)."""
        self._n += 1
        nonce = self._n.to_bytes(12, "big")
        inner = _prefix(event.content_type) + event.data
        sealed = b"".join((self._header, nonce, self._aead.encrypt(nonce, inner, _aad(event))))
        meta = MappingProxyType({**event.metadata, KEYID: self._keyid}) if event.metadata else self._meta
        return _copy(event, sealed, ENCRYPTED_CONTENT_TYPE, meta)

    def __repr__(self) -> str:
        return f"<Sealer keyid={self._keyid!r}>"


class Opener:
    """Opens sealed events with any key of a keyring (unwrapped data keys are cached)."""

    def __init__(self, keyring: Keyring) -> None:
        self.keyring = keyring
        self._deks: dict[bytes, AESGCM] = {}

    def open(self, event: Event) -> Event:
        """The plaintext event of a sealed one; anything else is returned as it is.

        :raises EventError: see the module docstring.
        """
        if event.content_type != ENCRYPTED_CONTENT_TYPE:
            return event
        keyid = event.metadata.get(KEYID)
        if not keyid:
            raise EventError(f"event {event.id} ({event.type}) is encrypted but carries no keyid; it cannot be opened")
        master = self.keyring.get(keyid)
        if master is None:
            held = ", ".join(self.keyring.names)
            raise EventError(
                f"event {event.id} ({event.type}) is encrypted with key {keyid!r}, which this process does not "
                f"hold (it holds: {held}); add that key to [crypto.keys]"
            )
        data = event.data
        if len(data) < _MIN_LEN or data[:1] != _VERSION:
            raise EventError(f"event {event.id} ({event.type}): encrypted data is malformed or of an unknown version")
        from cryptography.exceptions import InvalidTag

        header = data[:_HEADER]
        cache_key = keyid.encode() + header  # a cached DEK opens only under the key name it was wrapped for
        try:
            aead = self._deks.get(cache_key)
            if aead is None:
                dek = master.decrypt(header[1:13], header[13:], _wrap_aad(keyid))
                aead = aesgcm_class()(dek)
                if len(self._deks) >= _DEK_CACHE:
                    self._deks.clear()
                self._deks[cache_key] = aead
            inner = aead.decrypt(data[_HEADER : _HEADER + 12], data[_HEADER + 12 :], _aad(event))
        except InvalidTag:
            raise EventError(
                f"event {event.id} ({event.type}) does not decrypt with key {keyid!r}: its data was altered, "
                "moved from another event, or sealed by a different key of that name"
            ) from None
        n = int.from_bytes(inner[:2], "big")
        ctype = inner[2 : 2 + n].decode() if n else None
        meta = MappingProxyType({k: v for k, v in event.metadata.items() if k != KEYID})
        return _copy(event, inner[2 + n :], ctype, meta)

    def __repr__(self) -> str:
        return f"<Opener {self.keyring!r}>"
