"""Configuration of the ``rabbitmq`` transport (AMQP 0-9-1, aio-pika).

::

    [destinations.rmq]
    transport = "rabbitmq"
    url = "amqps://relay@rabbit.internal:5671/"   # no password here...
    password = "${RABBIT_PASSWORD}"               # ...but here (SecretStr)
    vhost = "prod"                                # overrides the URL's vhost
    exchange = "events"                           # Template; "" is the default exchange
    routing_key = "{category}.{type}"             # Template
    unroutable = "permanent"                      # or "retryable"

A password embedded in ``url`` is accepted but masked in every message and
repr (:func:`mask_url`); prefer ``password``. A message's target is
``"<exchange>/<routing key>"`` (exchange names cannot contain ``/``).
"""

from __future__ import annotations

import re
import ssl
from typing import Any, Literal
from urllib.parse import quote, urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator

from outrelay.kit import PermanentError, Template, TransportConfig

__all__ = ["RabbitMQConfig", "bad_names", "binding_pattern", "mask_url", "split_target", "subscription_target"]

_EXCHANGE_NAME = re.compile(r"^[A-Za-z0-9_.:\-]{0,255}$")
_PLACEHOLDER = re.compile(r"\{[a-z]+\}")
_URL_CREDS = re.compile(r"(?P<scheme>amqps?://)(?P<userinfo>[^@/]+)@", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``amqp://user:secret@host/`` -> ``amqp://user:***@host/``."""

    def sub(m: re.Match[str]) -> str:
        user, sep, _ = m.group("userinfo").partition(":")
        return f"{m.group('scheme')}{user}{':***' if sep else ''}@"

    return _URL_CREDS.sub(sub, url)


def bad_names(exchange: str, routing_key: str) -> str | None:
    """Why AMQP cannot carry this exchange name / routing key, or ``None`` if it can."""
    if not _EXCHANGE_NAME.match(exchange):
        return f"exchange name {exchange!r} is invalid: use up to 255 letters, digits and -_.:"
    if len(routing_key.encode()) > 255:
        return f"routing key of {len(routing_key.encode())} bytes exceeds AMQP's 255"
    return None


def split_target(target: str) -> tuple[str, str]:
    """``"exchange/routing.key"`` -> ``("exchange", "routing.key")``."""
    exchange, _, routing_key = target.partition("/")
    return exchange, routing_key


class RabbitMQConfig(TransportConfig):
    """Options of the ``rabbitmq`` transport; see the module docstring."""

    url: str = "amqp://guest:guest@127.0.0.1:5672/"
    user: str | None = None
    password: SecretStr | None = None
    vhost: str | None = None
    exchange: str = "outrelay"
    routing_key: str = "{type}"
    declare_exchange: bool = Field(False, description="declare the exchange (durable) at first use; for development")
    exchange_type: Literal["topic", "direct", "fanout", "headers"] = "topic"
    mandatory: bool = True
    unroutable: Literal["permanent", "retryable"] = "permanent"
    persistent: bool = True
    confirm_timeout: float = Field(10.0, gt=0, le=300, description="seconds to wait for a publisher confirm")
    pipeline: bool = Field(
        True,
        description="publish a stream's events of one batch back to back on the confirm channel instead of "
        "waiting for each confirm; false = strictly one unconfirmed message per stream",
    )
    connect_timeout: float = Field(5.0, gt=0, le=60)
    group_shards: int = Field(
        16,
        ge=1,
        le=1024,
        description="subscriptions: shard queues per consumer group, spread over its members (needs the "
        "rabbitmq_consistent_hash_exchange plugin); 1 = one single-active-consumer queue (no plugin, no load sharing)",
    )
    queue_type: Literal["classic", "quorum"] = Field(
        "classic",
        description="subscriptions: the type of a consumer group's queues (shards, or the single-active-consumer "
        "queue); quorum = replicated raft queues (x-queue-type quorum), consumed by one member at a time like the "
        "classic ones; an existing group keeps the type it was declared with",
    )
    max_message_bytes: int = Field(8 * 1024 * 1024, ge=1, le=512 * 1024 * 1024)
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None

    @field_validator("url")
    @classmethod
    def _amqp_url(cls, v: str) -> str:
        if not v.lower().startswith(("amqp://", "amqps://")):
            raise ValueError(f"url {mask_url(v)!r} must start with amqp:// or amqps://")
        return v

    @field_validator("exchange")
    @classmethod
    def _exchange_name(cls, v: str) -> str:
        if not _EXCHANGE_NAME.match(_PLACEHOLDER.sub("", v)):
            raise ValueError(f"exchange {v!r} is invalid: use letters, digits, -_.: and {{placeholders}}")
        return v

    def __repr_args__(self) -> Any:
        for k, v in super().__repr_args__():
            yield k, (mask_url(v) if k == "url" and isinstance(v, str) else v)

    @property
    def where(self) -> str:
        """The broker URL with the password masked (and the vhost override applied)."""
        return mask_url(self.connection_url())

    def secrets(self) -> list[str]:
        """Every secret string, so error texts can be scrubbed of them."""
        out = [self.password.get_secret_value()] if self.password else []
        url_password = urlsplit(self.url).password
        if url_password:
            out.append(url_password)
        return [s for s in out if s]

    def connection_url(self) -> str:
        """The URL with ``user``/``password``/``vhost`` applied (the password is revealed here only)."""
        parts = urlsplit(self.url)
        user = self.user if self.user is not None else parts.username
        password = self.password.get_secret_value() if self.password else parts.password
        netloc = parts.hostname or "127.0.0.1"
        if ":" in netloc:
            netloc = f"[{netloc}]"
        if parts.port:
            netloc += f":{parts.port}"
        if user:
            creds = quote(user, safe="") + (":" + quote(password, safe="") if password else "")
            netloc = f"{creds}@{netloc}"
        path = parts.path
        if self.vhost is not None:
            path = "/" + quote(self.vhost, safe="")
        scheme = "amqps" if self.tls or self.tls_ca_file or self.tls_cert_file else parts.scheme
        return urlunsplit((scheme, netloc, path or "/", parts.query, ""))

    def ssl_context(self) -> ssl.SSLContext | None:
        if not self.connection_url().lower().startswith("amqps://"):
            return None
        ctx = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return ctx


def subscription_target(cfg: RabbitMQConfig, target: str, destination: str) -> tuple[str, str]:
    """``(exchange, binding key)`` of a subscription to ``target`` (``""``: derived from the destination's
    templates, see :mod:`outrelay.transports.rabbitmq._subscriber`).

    :raises PermanentError: the target cannot be consumed; the message names the option and the fix.
    """
    where = f"destinations.{destination}"
    fix = 'or subscribe with an explicit target "exchange/binding-key"'
    if target:
        exchange, binding_key = split_target(target)
    else:
        if not Template(cfg.exchange).is_static:
            raise PermanentError(
                f"{where}.exchange {cfg.exchange!r} is a template and a subscription cannot consume a "
                f"pattern of exchanges: use a fixed exchange, {fix}",
                destination=destination,
            )
        exchange, binding_key = cfg.exchange, binding_pattern(cfg.routing_key)
        if binding_key != cfg.routing_key and cfg.exchange_type in ("direct", "headers"):
            raise PermanentError(
                f"{where}.routing_key {cfg.routing_key!r} has placeholders and a {cfg.exchange_type} "
                f'exchange cannot match a pattern: set a fixed routing_key, use exchange_type = "topic", {fix}',
                destination=destination,
            )
    if not exchange:
        raise PermanentError(
            f"{where}: subscription target {target or cfg.exchange + '/'!r} is on the default exchange, "
            "which cannot be bound: publish to a named exchange (option exchange)",
            destination=destination,
        )
    invalid = bad_names(exchange, binding_key)
    if invalid is not None or "{" in exchange:
        raise PermanentError(f"{where}: subscription target {target!r}: {invalid or 'a template'}",
                             destination=destination)  # fmt: skip
    return exchange, binding_key


def binding_pattern(routing_key: str) -> str:
    """A topic binding key matching every key ``routing_key`` (a Template) renders: each dot-separated
    word holding a placeholder becomes ``#`` (a value such as a type may itself contain dots)."""
    words: list[str] = []
    for word in routing_key.split("."):
        if "{" in word.replace("{{", "").replace("}}", ""):
            if words and words[-1] == "#":
                continue  # "#.#" matches what "#" does
            word = "#"
        words.append(word.replace("{{", "{").replace("}}", "}"))
    return ".".join(words)
