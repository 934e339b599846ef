"""The ``[crypto]`` section: its models, registered by the crypto plugin
(hook ``outrelay_config_sections``), and the typed accessor the plugin and the
CLI read it with. Imports no cryptography library: the config loads without one.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from outrelay.core.config.hookspecs import ConfigView

if TYPE_CHECKING:
    from outrelay.core.config.config import OutrelayConfig

__all__ = ["CryptoConfig", "CryptoRule", "crypto_config"]

#: a key name: what destination names may be too (1-64 letters, digits, '_', '-' or '.')
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class CryptoRule(BaseModel):
    """One ``[[crypto.rules]]`` entry: which events are encrypted for which destinations.

    An event is encrypted for a destination when any rule matches it; empty
    filters match everything (``types`` are globs, as routes use).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    types: tuple[str, ...] = Field(("*",), description="event type globs whose data is encrypted")
    tenants: tuple[str, ...] = Field((), description="only these tenants' events (exact names); empty: any tenant")
    destinations: tuple[str, ...] = Field((), description="only for these destinations; empty: every destination")


class CryptoConfig(BaseModel):
    """The ``[crypto]`` table: AES-256-GCM payload encryption (``outrelay[crypto]``,
    see :mod:`outrelay.plugins.crypto` and docs/encryption.md).

    ``keys`` name where each key is (``env:VAR`` or ``file:/path``), never the
    key itself, so the config can be shown and logged safely. Only
    ``encrypt_with`` encrypts; every listed key decrypts (rotation).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    keys: dict[str, str] = Field(
        description="key name -> `env:VAR` or `file:/path` holding 32 random bytes (base64 or hex text, or the "
        "raw bytes in a file); the name travels with each encrypted event as its `keyid`"
    )
    encrypt_with: str = Field(description="the key that encrypts (the current one); the other keys only decrypt")
    rules: tuple[CryptoRule, ...] = Field(
        (CryptoRule(),),
        description="`[[crypto.rules]]` entries with `types` (globs), `tenants` and `destinations` filters; "
        "an event is encrypted for a destination when any rule matches; default: every event, every destination",
    )
    at_rest: bool = Field(
        False,
        description="also encrypt matching events when they are appended (the outbox then holds ciphertext); "
        "destinations no rule selects get them decrypted by the relay",
    )

    @field_validator("keys")
    @classmethod
    def _key_refs(cls, v: dict[str, str]) -> dict[str, str]:
        if not v:
            raise ValueError('needs at least one key: name = "env:VAR" or "file:/path"')
        for name, ref in v.items():
            if not _NAME_RE.match(name):
                raise ValueError(f"key name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
            # never echo the value: it may be a key pasted in by mistake
            if not (ref.startswith(("env:", "file:")) and ref.partition(":")[2]):
                raise ValueError(f"key {name!r} must be env:VAR or file:/path (where the key is, not the key itself)")
        return v

    @model_validator(mode="after")
    def _current_key(self) -> CryptoConfig:
        if self.encrypt_with not in self.keys:
            raise ValueError(
                f"encrypt_with names key {self.encrypt_with!r}, which is not in crypto.keys "
                f"(defined: {', '.join(sorted(self.keys))})"
            )
        if not self.rules:
            raise ValueError("rules is empty: leave it out to encrypt every event, or add a rule")
        return self

    def check_config(self, config: OutrelayConfig) -> None:
        """Every destination a rule names is defined in ``config``.

        :raises ValueError: ``crypto.rules[i] names destination ...`` (the config error's text).
        """
        for i, rule in enumerate(self.rules):
            for dest in rule.destinations:
                if dest not in config.destinations:
                    known = ", ".join(sorted(config.destinations)) or "none"
                    raise ValueError(
                        f"crypto.rules[{i}] names destination {dest!r}, which is not defined (defined: {known})"
                    )


def crypto_config(config: ConfigView) -> CryptoConfig | None:
    """The ``[crypto]`` section of ``config``, or None when the file has none (encryption off)."""
    return config.section("crypto", CryptoConfig)
