"""``PayloadCrypto``: the ``[crypto]`` table put to work.

Which events are sealed for which destination (the rules), the relay's
per-batch transform, the outbox's at-rest encoder, and decryption.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase

from outrelay.core.config.config import OutrelayConfig
from outrelay.core.contract.segments import RejectedTarget
from outrelay.core.contract.transport import Message
from outrelay.core.model._draft import copier
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import EventError
from outrelay.plugins.crypto._config import CryptoConfig, CryptoRule, crypto_config
from outrelay.plugins.crypto._keys import Keyring
from outrelay.plugins.crypto._seal import ENCRYPTED_CONTENT_TYPE, Opener, Sealer

__all__ = ["PayloadCrypto", "installed", "uninstall"]

_Matcher = Callable[[Event], bool]
#: with_event(message, event) / refused(message, target): a message with that field replaced
_with_event: Callable[[Message, Event], Message] = copier(Message, "event")
_refused: Callable[[Message, str], Message] = copier(Message, "target")


def _every(e: Event) -> bool:
    return True


def _matcher(rules: Sequence[CryptoRule]) -> _Matcher:
    """A predicate: does any rule's ``types``/``tenants`` match the event (cached per type and tenant)."""
    if any(r.types == ("*",) and not r.tenants for r in rules):
        return _every
    if not rules:
        return lambda e: False
    cache: dict[tuple[str, str | None], bool] = {}

    def match(e: Event) -> bool:
        k = (e.type, e.tenant)
        hit = cache.get(k)
        if hit is None:
            hit = any(
                (not r.tenants or e.tenant in r.tenants) and any(fnmatchcase(e.type, p) for p in r.types) for r in rules
            )
            if len(cache) > 10_000:
                cache.clear()
            cache[k] = hit
        return hit

    return match


class PayloadCrypto:
    """The keys and rules of a ``[crypto]`` table.

    Build with :meth:`from_config` (reads the keys). :meth:`install` makes
    this process's subscribers decrypt with it.
    """

    def __init__(self, config: CryptoConfig, keyring: Keyring) -> None:
        self.config = config
        self.keyring = keyring
        self._opener = Opener(keyring)
        self._at_rest = _matcher(config.rules)

    @classmethod
    def from_config(cls, config: OutrelayConfig | CryptoConfig) -> PayloadCrypto:
        """Read the keys of ``config`` (an ``OutrelayConfig`` needs a ``[crypto]`` table).

        :raises ConfigError: no ``[crypto]`` table, or a key cannot be read.
        :raises MissingExtraError: ``cryptography`` is not installed.
        """
        crypto = crypto_config(config) if isinstance(config, OutrelayConfig) else config
        if crypto is None:
            from outrelay.core.model.errors import ConfigError

            raise ConfigError("the config has no [crypto] table; see docs/encryption.md")
        return cls(crypto, Keyring.load(crypto.keys, crypto.encrypt_with))

    # -- sealing ----------------------------------------------------------------

    def encrypt(self, events: Sequence[Event]) -> list[Event]:
        """Seal every event not sealed yet, with the current key (one data key for the call)."""
        sealer: Sealer | None = None
        out = []
        for e in events:
            if e.content_type != ENCRYPTED_CONTENT_TYPE:
                sealer = sealer or Sealer(self.keyring)
                e = sealer.seal(e)
            out.append(e)
        return out

    def decrypt(self, event: Event) -> Event:
        """The plaintext of a sealed event; any other event as it is.

        :raises EventError: a key this process does not hold, or altered data.
        """
        return self._opener.open(event)

    @property
    def outbox_encoder(self) -> Callable[[list[Event]], list[Event]] | None:
        """With ``at_rest = true``: seals the events some rule selects, for
        ``Outbox.open(url, encode=...)``; otherwise None."""
        if not self.config.at_rest:
            return None
        selected = self._at_rest

        def encode(events: list[Event]) -> list[Event]:
            sealer: Sealer | None = None
            out = []
            for e in events:
                if selected(e) and e.content_type != ENCRYPTED_CONTENT_TYPE:
                    sealer = sealer or Sealer(self.keyring)
                    e = sealer.seal(e)
                out.append(e)
            return out

        return encode

    def send_transform(self, destination: str) -> Callable[[list[Message]], list[Message]] | None:
        """The relay's per-batch transform for ``destination``, or None when no rule
        names it and nothing is sealed at rest (then the destination pays nothing).

        Selected events are sealed (one data key per batch); events already
        sealed at rest go as they are to destinations that select them and are
        opened for the others. One that cannot be opened is refused (a
        :class:`RejectedTarget` saying why: it is dead-lettered).
        """
        rules = [r for r in self.config.rules if not r.destinations or destination in r.destinations]
        if not rules and not self.config.at_rest:
            return None
        selected = _matcher(rules)
        keyring, opener = self.keyring, self._opener

        def transform(messages: list[Message]) -> list[Message]:
            sealer: Sealer | None = None
            out = []
            for m in messages:
                e = m.event
                if e.content_type == ENCRYPTED_CONTENT_TYPE:
                    if selected(e):
                        out.append(m)
                        continue
                    try:
                        out.append(_with_event(m, opener.open(e)))
                    except EventError as exc:
                        out.append(_refused(m, RejectedTarget(str(exc))))
                elif selected(e):
                    sealer = sealer or Sealer(keyring)
                    out.append(_with_event(m, sealer.seal(e)))
                else:
                    out.append(m)
            return out

        return transform

    def install(self) -> None:
        """Make subscriptions started from now on in this process decrypt with these keys."""
        global _installed
        _installed = self

    def __repr__(self) -> str:
        return f"<PayloadCrypto keys={sorted(self.keyring.names)!r} encrypt_with={self.keyring.current!r}>"


_installed: PayloadCrypto | None = None


def installed() -> PayloadCrypto | None:
    """The keys this process's subscribers decrypt with (see :meth:`PayloadCrypto.install`)."""
    return _installed


def uninstall() -> None:
    """Subscriptions started from now on hand sealed events to handlers as they arrive."""
    global _installed
    _installed = None
