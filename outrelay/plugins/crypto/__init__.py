"""Payload encryption (``pip install 'outrelay[crypto]'``): AES-256-GCM envelope
encryption of event data, configured by the ``[crypto]`` table::

    [crypto]
    encrypt_with = "k2"                  # the current key: it encrypts
    at_rest = false                      # true: append already stores ciphertext
    [crypto.keys]                        # every key decrypts (rotation)
    k1 = "env:OUTRELAY_KEY_K1"
    k2 = "file:/run/secrets/outrelay-k2"
    [[crypto.rules]]                     # none: every event, every destination
    types = ["payment.*"]
    tenants = ["acme"]
    destinations = ["partners"]

What happens where:

* **relay**: through the ``outrelay_send_transform`` hook, each batch for a
  destination some rule names has its selected events sealed (one fresh
  data key per batch, wrapped by the ``encrypt_with`` key; see
  :mod:`outrelay.plugins.crypto._seal` for the format). Sealed events carry
  content type :data:`ENCRYPTED_CONTENT_TYPE` and metadata/CloudEvents
  extension ``keyid``; every other attribute stays in clear.
* **outbox** (``at_rest = true``): ``Outbox.open(url,
  encode=PayloadCrypto.from_config(cfg).outbox_encoder)`` seals selected
  events on append; the relay sends them as they are to the destinations
  the rules select and decrypts them for the others.
* **subscribers**: after :meth:`PayloadCrypto.install`, subscriptions started
  in this process decrypt before upcasting and the handler (the
  ``outrelay_receive_transform`` hook). An event sealed with a key the
  process does not hold, or altered, is dead-lettered at once with the
  reason. Without ``install`` handlers get sealed events as they arrived.
* **``outrelay dlq show``** decrypts when the config's keys can be read.

Keys are read from the environment or files and never printed: not in
reprs, errors or logs. A missing ``cryptography`` fails only when ``[crypto]``
is used, naming the ``pip install`` line.
"""

from __future__ import annotations

from collections.abc import Callable

from pydantic import BaseModel

from outrelay.core.config.config import OutrelayConfig
from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.contract.transport import Message
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError, EventError
from outrelay.plugins.crypto._config import CryptoConfig, CryptoRule, crypto_config
from outrelay.plugins.crypto._payload import PayloadCrypto, installed, uninstall
from outrelay.plugins.crypto._seal import ENCRYPTED_CONTENT_TYPE, KEYID, is_sealed

__all__ = [
    "ENCRYPTED_CONTENT_TYPE",
    "KEYID",
    "CryptoConfig",
    "CryptoRule",
    "PayloadCrypto",
    "crypto_config",
    "installed",
    "is_sealed",
    "reveal",
    "uninstall",
]

_last: tuple[object, PayloadCrypto] | None = None  # the relay's: keys are read once per [crypto] table


def _for(config: OutrelayConfig) -> PayloadCrypto:
    global _last
    crypto = crypto_config(config)
    if _last is None or _last[0] is not crypto:
        _last = (crypto, PayloadCrypto.from_config(config))
    return _last[1]


@hookimpl
def outrelay_config_sections() -> dict[str, type[BaseModel]]:
    """This plugin owns ``[crypto]`` (optional: absent, nothing is encrypted)."""
    return {"crypto": CryptoConfig}


@hookimpl
def outrelay_send_transform(
    config: OutrelayConfig, destination: str
) -> Callable[[list[Message]], list[Message]] | None:
    if crypto_config(config) is None:
        return None
    return _for(config).send_transform(destination)


@hookimpl
def outrelay_receive_transform(consumer: str) -> Callable[[Event], Event] | None:
    crypto = installed()
    return None if crypto is None else crypto.decrypt


@hookimpl
def outrelay_bus_configured(config: OutrelayConfig) -> None:
    if crypto_config(config) is not None:
        PayloadCrypto.from_config(config).install()


def reveal(config: OutrelayConfig, event: Event) -> tuple[Event, str | None]:
    """For operators' views (``outrelay dlq show``): ``event`` decrypted when
    ``config``'s keys can be read and open it, with a note saying what was done.

    Never raises for a sealed event: without the key the note says why it stays
    encrypted. ``(event, None)`` for an event that is not sealed.
    """
    if not is_sealed(event):
        return event, None
    keyid = event.metadata.get(KEYID, "?")
    if crypto_config(config) is None:
        return event, f"encrypted with key {keyid!r}; the config has no [crypto] table to decrypt it"
    try:
        return _for(config).decrypt(event), f"decrypted with key {keyid!r}"
    except (ConfigError, EventError) as exc:
        return event, f"encrypted with key {keyid!r}, not decrypted: {exc}"
