"""Options of the ``redis`` transport (validated, frozen, secrets masked).

Example::

    [destinations.redis]
    transport = "redis"
    url = "rediss://cache.internal:6380/0"   # rediss:// = TLS; no password in the URL
    username = "relay"                         # an ACL user
    password = "${REDIS_PASSWORD}"
    stream = "events:{category}"               # a Template: {type} {category} {stream} {tenant} ...
    maxlen = 1000000                           # XADD MAXLEN ~ (approximate trimming)

Redis Cluster: set ``cluster = true`` and point ``url`` at any node (a
seed: the client discovers the others). One Redis stream lives in one hash
slot, so per-stream order holds whatever the key; keys spread over the
slots, and the relay sends each slot's events in one script call. To keep
related keys in one slot, use a hash tag — the part of the key between
``{`` and ``}``. Template braces are placeholders, so write a literal brace
doubled: ``"events:{{{stream}}}"`` renders ``events:{order-42}`` (hash tag =
the event's stream), and ``"{{events}}:{category}"`` renders
``{events}:order`` (every key in the slot of ``events``). A cluster node
under ``cluster = false``, or a standalone server under ``cluster = true``,
fails ``open``/``check`` with a PermanentError naming the fix.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator, model_validator

from outrelay.kit import Template, TransportConfig

__all__ = ["RedisConfig"]


class RedisConfig(TransportConfig):
    """Connection and XADD options; see the module docstring.

    ``dedupe = "auto"`` uses ``XADD ... IDMP <producer_id> <event id>`` when the
    server is Redis 8.6 or newer (detected at open) and declares native
    dedupe with ``dedupe_window`` seconds (set it to the server's
    ``IDMP-DURATION``); older servers get no native dedupe. ``producer_id``
    must be the same for every relay of one outbox, so they dedupe together.
    ``batching = "script"`` needs the ACL user to run scripts (``+evalsha
    +eval``); ``"pipeline"`` needs only ``+xadd`` but takes one round trip per
    event of the busiest stream in a batch.
    """

    url: str = "redis://127.0.0.1:6379/0"
    cluster: bool = Field(False, description="Redis Cluster: `url` is a seed node, keys are spread over slots")
    stream: str = "outrelay:events"
    mode: Literal["binary", "structured"] = "binary"
    maxlen: int | None = Field(None, ge=1, description="trim with XADD MAXLEN ~ maxlen")
    dedupe: Literal["auto", "off"] = "auto"
    batching: Literal["script", "pipeline"] = "script"
    producer_id: str = Field("outrelay", min_length=1, max_length=200)
    dedupe_window: float = Field(100.0, gt=0)
    username: str | None = None
    password: SecretStr | None = None
    ssl_ca_certs: str | None = None
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    ssl_check_hostname: bool = True
    max_message_bytes: int = Field(1_048_576, ge=1, le=512 * 1024 * 1024)
    connect_timeout: float = Field(2.0, gt=0, le=120)
    socket_timeout: float = Field(10.0, gt=0, le=600)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        parts = urlsplit(v)
        if parts.scheme not in ("redis", "rediss", "unix"):
            raise ValueError("url must start with redis://, rediss:// (TLS) or unix://")
        if parts.password:
            # the URL ends up in logs and error messages: keep the secret out of it
            raise ValueError('put the password in `password` (e.g. password = "${REDIS_PASSWORD}"), not in the url')
        return v

    @model_validator(mode="after")
    def _cluster_url(self) -> RedisConfig:
        if self.cluster:
            parts = urlsplit(self.url)
            if parts.scheme == "unix":
                raise ValueError("cluster = true needs a redis:// or rediss:// url (a node's host:port), not unix://")
            if parts.path.strip("/") not in ("", "0"):
                raise ValueError(f"Redis Cluster has only database 0: drop {parts.path!r} from the url")
        return self

    @field_validator("stream")
    @classmethod
    def _template(cls, v: str) -> str:
        Template(v, where="stream")
        return v

    @property
    def tls(self) -> bool:
        return self.url.startswith("rediss://")
