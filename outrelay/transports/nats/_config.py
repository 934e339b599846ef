"""Configuration of the ``nats`` transport (JetStream).

::

    [destinations.bus]
    transport = "nats"
    servers = ["nats://127.0.0.1:4222"]
    subject = "events.{category}.{stream}"    # a Template
    expected_stream = "EVENTS"                 # optional: Nats-Expected-Stream
    pipeline = "auto"                          # true | false | "auto": see below
    atomic = "auto"                            # true | false | "auto": atomic batches, see _atomic.py
    order_guard = "off"                        # "auto" | "last-msg-id" (experimental): see _chain.py
    # credentials: at most one of credentials_file / nkey_seed_file / token / user+password
    credentials_file = "/etc/nats/relay.creds"
    [destinations.bus.create_stream]           # dev only: create the stream at open
    name = "EVENTS"
    subjects = ["events.>"]

Secrets are :class:`pydantic.SecretStr`; a password embedded in a server URL
is masked in every message (:func:`mask_url`).
"""

from __future__ import annotations

import re
import ssl
from typing import Any, Literal, NamedTuple

import nats.js.api
from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

from outrelay.kit import PermanentError, TransportConfig
from outrelay.kit import mask_url as kit_mask_url

__all__ = [
    "NatsConfig",
    "PublishMode",
    "StreamSpec",
    "atomic_not_allowed",
    "derive_target",
    "mask_url",
    "publish_mode",
    "stream_traits",
]


def mask_url(url: str) -> str:
    """``nats://user:secret@host`` -> ``nats://user:***@host`` (a bare token is masked whole)."""
    return kit_mask_url(url, bare_is_secret=True)


class StreamSpec(BaseModel):
    """A stream to create (if missing) when the transport opens; meant for development."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(min_length=1)
    subjects: tuple[str, ...] = Field(min_length=1)
    storage: Literal["file", "memory"] = "file"
    duplicate_window: float = Field(120.0, gt=0, description="seconds in which a repeated Nats-Msg-Id is dropped")
    replicas: int = Field(1, ge=1, le=5)
    allow_atomic: bool = Field(False, description="allow atomic batch publishing (nats-server 2.12+; see atomic)")


class NatsConfig(TransportConfig):
    """Options of the ``nats`` transport; see the module docstring."""

    servers: tuple[str, ...] = ("nats://127.0.0.1:4222",)
    subject: str = "{type}"
    expected_stream: str | None = None
    create_stream: StreamSpec | None = None
    ack_timeout: float = Field(5.0, gt=0, le=300, description="seconds to wait for a JetStream ack")
    pipeline: bool | Literal["auto"] = Field(
        "auto",
        description="true: publish a batch's events back to back on one ordered connection instead of waiting for "
        "each ack; false: at most one unacked message per stream (streams still in parallel); auto: true, except "
        "into a replicated or discard=new JetStream stream without atomic batches or the order guard, where a "
        "refused message could be overtaken by the next one of its stream: there false",
    )
    atomic: bool | Literal["auto"] = Field(
        "auto",
        description="publish each batch as one JetStream atomic batch (stored all together or not at all; "
        "nats-server 2.12+, a stream with allow_atomic), so pipelining keeps per-stream order through stream "
        "leader changes; auto: when pipelining into a known stream that allows atomic batches and is replicated "
        "or discards new messages; true: always (refused at open when the stream does not allow it); false: never",
    )
    order_guard: Literal["auto", "last-msg-id", "off"] = Field(
        "off",
        description="EXPERIMENTAL, off by default: chain every message to the previous one with "
        "Nats-Expected-Last-Msg-Id so the server stores nothing past a lost or refused message (pipelined "
        "order through discard=new refusals); auto: on when pipelining into a known stream (expected_stream, "
        "create_stream or a static subject) that discards new messages and is not replicated; needs this "
        "destination to be the stream's only publisher. Refused at open on a replicated stream: on nats-server 2.9 "
        "its replicas can drop messages after the refusals the guard causes, and on 2.14 the stream acknowledged "
        "nothing more after the first refusal (docs/clusters.md)",
    )
    connect_timeout: float = Field(2.0, gt=0, le=60)
    reconnect_time_wait: float = Field(0.5, ge=0, le=60)
    max_message_bytes: int = Field(1_000_000, ge=1, description="data bytes; headers use the rest of max_payload")
    name: str = "outrelay"
    group_shards: int = Field(
        1,
        ge=1,
        le=64,
        description="subscriptions: shards per consumer group, each held by one member at a time (the unit of load "
        "sharing and of per-stream order); every shard reads every message, so more shards spread slow handlers "
        "over members at the cost of reading each message that many times; 1: one active member, the others hot "
        "standbys; every member of a group must use the same value",
    )
    # TLS: `tls = true` uses the system trust store; the files override it.
    tls: bool = False
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_hostname: str | None = None
    # Credentials (at most one kind).
    credentials_file: str | None = None
    nkey_seed_file: str | None = None
    token: SecretStr | None = None
    user: str | None = None
    password: SecretStr | None = None

    @model_validator(mode="after")
    def _one_credential(self) -> NatsConfig:
        kinds = [
            k
            for k, given in (
                ("credentials_file", self.credentials_file),
                ("nkey_seed_file", self.nkey_seed_file),
                ("token", self.token),
                ("user/password", self.user or self.password),
            )
            if given
        ]
        if len(kinds) > 1:
            raise ValueError(f"give one kind of credentials, not {' and '.join(kinds)}")
        if self.password and not self.user:
            raise ValueError("password needs user")
        if not self.servers:
            raise ValueError("servers must name at least one nats:// URL")
        if self.atomic is True and self.pipeline is False:
            raise ValueError("atomic = true publishes pipelined batches: remove pipeline = false (or atomic)")
        if self.atomic is True and self.order_guard == "last-msg-id":
            raise ValueError(
                'atomic = true and order_guard = "last-msg-id" exclude each other (an atomic batch cannot carry '
                "Nats-Expected-Last-Msg-Id, and it needs no guard): remove one"
            )
        if self.order_guard == "last-msg-id" and not (self.expected_stream or self.create_stream):
            raise ValueError(
                'order_guard = "last-msg-id" needs the stream it guards: set expected_stream (or create_stream)'
            )
        return self

    def __repr_args__(self) -> Any:
        for k, v in super().__repr_args__():
            yield k, (tuple(mask_url(s) for s in v) if k == "servers" else v)

    def ssl_context(self) -> ssl.SSLContext | None:
        """The TLS context, or ``None`` when TLS is off and no ``tls://`` server is named."""
        wants = self.tls or self.tls_ca_file or self.tls_cert_file or any(s.startswith("tls://") for s in self.servers)
        if not wants:
            return None
        ctx = ssl.create_default_context(cafile=self.tls_ca_file)
        if self.tls_cert_file:
            ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        return ctx

    def connect_options(self) -> dict[str, Any]:
        """Keyword arguments for ``nats.connect`` (secrets revealed here only)."""
        opts: dict[str, Any] = {
            "servers": list(self.servers),
            "name": self.name,
            "connect_timeout": self.connect_timeout,
            "reconnect_time_wait": self.reconnect_time_wait,
            "tls": self.ssl_context(),
            "tls_hostname": self.tls_hostname,
        }
        if self.credentials_file:
            opts["user_credentials"] = self.credentials_file
        if self.nkey_seed_file:
            opts["nkeys_seed"] = self.nkey_seed_file
        if self.token:
            opts["token"] = self.token.get_secret_value()
        if self.user:
            opts["user"] = self.user
            opts["password"] = self.password.get_secret_value() if self.password else ""
        return opts

    @property
    def where(self) -> str:
        """The servers, masked, for messages."""
        return ", ".join(mask_url(s) for s in self.servers)


class PublishMode(NamedTuple):
    """How the transport publishes into one stream (decided at open from the stream's configuration)."""

    atomic: bool  # each batch one JetStream atomic batch (see _atomic.py)
    guarded: bool  # the order guard chains messages (see _chain.py)
    pipelined: bool  # a stream's messages back to back, else one unacked message per stream

    def describe(self) -> str:
        if self.atomic:
            return "pipelined in atomic batches"
        if self.guarded:
            return "pipelined, order guard on"
        return "pipelined" if self.pipelined else "one unacked message per stream"


def stream_traits(config: nats.js.api.StreamConfig) -> dict[str, bool]:
    """What :func:`publish_mode` needs from a stream's configuration, as keyword arguments."""
    return {
        "replicated": (config.num_replicas or 1) > 1,
        "refuses": config.discard == nats.js.api.DiscardPolicy.NEW,
        "allows_atomic": bool(config.allow_atomic),
    }


def publish_mode(cfg: NatsConfig, *, replicated: bool, refuses: bool, allows_atomic: bool) -> PublishMode:
    """``pipeline``, ``atomic`` and ``order_guard`` applied to a stream that is ``replicated``, ``refuses``
    new messages when full (``discard = new``) and ``allows_atomic`` batches (what is unknown is False).

    Pipelining is plain where a refused message cannot be overtaken by the next one of its stream (an R1
    stream that discards old messages); elsewhere it needs atomic batches (preferred) or the order guard
    (never on a replicated stream: the caller refuses that), or it is one unacked message per stream.
    An explicit ``order_guard = "last-msg-id"`` wins over ``atomic = "auto"``.
    """
    may_pipeline = cfg.pipeline is not False
    explicit_guard = cfg.order_guard == "last-msg-id"
    atomic = may_pipeline and (
        cfg.atomic is True
        or (cfg.atomic == "auto" and not explicit_guard and allows_atomic and (replicated or refuses))
    )
    guarded = not atomic and (
        explicit_guard or (cfg.order_guard == "auto" and may_pipeline and refuses and not replicated)
    )
    pipelined = cfg.pipeline is True or (cfg.pipeline == "auto" and (atomic or guarded or not (replicated or refuses)))
    return PublishMode(atomic, guarded, pipelined)


def atomic_not_allowed(stream: str) -> str:
    """The one-line error for ``atomic = true`` into ``stream``, which does not allow atomic batches."""
    return (
        f"atomic = true, but stream {stream!r} does not allow atomic batches: create it with allow_atomic = true "
        "(nats-server 2.12 or newer), or remove atomic"
    )


_PLACEHOLDER = re.compile(r"\{[a-z]+\}")


def derive_target(subject: str, *, destination: str) -> str:
    """The wildcard covering every subject the ``subject`` template renders.

    :raises PermanentError: a placeholder shares a token with literal text.
    """
    tokens = subject.split(".")
    out: list[str] = []
    for i, token in enumerate(tokens):
        if "{" not in token:
            out.append(token)
        elif _PLACEHOLDER.fullmatch(token):
            out.append(">" if i == len(tokens) - 1 else "*")
        else:
            raise PermanentError(
                f"subject {subject!r}: token {token!r} mixes a placeholder with text, which no NATS wildcard "
                "can match; give the subscription an explicit target (a subject or wildcard)",
                destination=destination,
            )
    return ".".join(out)
