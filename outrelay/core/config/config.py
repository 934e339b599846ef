"""The configuration file: one TOML document, validated, frozen.

::

    [outbox]
    url = "sqlite:///outbox.db"

    [relay]                      # all optional
    poll_interval = 0.5

    [destinations.hooks]
    transport = "webhook"
    url = "https://example.com/hook"
    secret = "${HOOK_SECRET}"    # ${VAR} or ${VAR:-default}
    batch_size = 100             # common options, see DestinationConfig
    [destinations.hooks.retry]
    max_attempts = 12

    [[routes]]
    types = ["workflow.*"]       # globs; default: all
    destinations = ["hooks"]
    on_exhausted = "dead-letter" # or "park"

Without any ``[[routes]]``, every event goes to every destination. With
routes, an event goes to the destinations of every route it matches; an event
that matches none is delivered nowhere, and the relay logs it once per type and
counts it (``outrelay status``, ``/metrics``, the run summary).

Every error is a :class:`~outrelay.ConfigError` naming the file and key.
Transport options are validated by the transport's own model when the
destination is built (:meth:`Registry.create_transport`), addresses too (a
port no socket can use); ``outrelay check --offline``, ``check`` and ``run``
validate the whole config alike, before anything is created.
"""

from __future__ import annotations

import functools
import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    create_model,
    field_validator,
    model_validator,
)

from outrelay.core.config.endpoints import endpoint_problem
from outrelay.core.config.validation import format_validation_error
from outrelay.core.model.errors import ConfigError

if TYPE_CHECKING:
    from outrelay.core.config.registry import Registry

__all__ = [
    "AttemptsConfig",
    "AuditConfig",
    "BreakerConfig",
    "BusConfig",
    "ClaimCheckConfig",
    "DestinationConfig",
    "OutboxConfig",
    "OutrelayConfig",
    "RelayConfig",
    "RetryPolicy",
    "RouteConfig",
    "config_model",
    "default_config_path",
    "interpolate",
    "load_config",
    "parse_config",
    "section_default",
]

_ENV_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*?))?\}")
_S = TypeVar("_S", bound=BaseModel)
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class RetryPolicy(_Frozen):
    """Exponential backoff with full jitter, per destination.

    The n-th retry waits ``min(max_delay, initial_delay * multiplier**(n-1))``
    scaled by a random factor in ``[1 - jitter, 1]``; a broker's Retry-After
    hint raises the wait (capped at ``max_retry_after``). After
    ``max_attempts`` attempts the route's ``on_exhausted`` policy applies.
    """

    max_attempts: int = Field(10, ge=1, le=10_000)
    initial_delay: float = Field(0.5, gt=0, le=3600)
    max_delay: float = Field(300.0, gt=0, le=86_400)
    multiplier: float = Field(2.0, ge=1.0, le=10.0)
    jitter: float = Field(0.5, ge=0.0, le=1.0)
    max_retry_after: float = Field(3600.0, ge=0, le=86_400)


class BreakerConfig(_Frozen):
    """The ``[destinations.NAME.breaker]`` table: a circuit breaker for the destination
    (see :mod:`outrelay.core.relay.breaker`). Off unless the table is present.

    Open, the destination is sent one probe per ``probe_interval`` (the head of
    one stream) instead of its traffic; the first delivery closes it. A probe
    that fails leaves its event pending as it was: no attempt counted, no
    backoff, order kept.
    """

    failures: int = Field(
        50,
        ge=1,
        le=1_000_000,
        description="consecutive failed attempts (events that failed retryably, counted one per event) that "
        "open the breaker",
    )
    failure_ratio: float | None = Field(
        None,
        gt=0,
        le=1,
        description="also open when at least this fraction of the attempts of the last `window` seconds failed "
        "(once there were `min_attempts` of them); unset: consecutive failures only",
    )
    window: float = Field(60.0, gt=0, le=3600, description="seconds of attempts `failure_ratio` looks at")
    min_attempts: int = Field(
        20, ge=1, le=1_000_000, description="attempts in the window before `failure_ratio` may open the breaker"
    )
    probe_interval: float = Field(
        30.0, gt=0, le=3600, description="while open, seconds between two probes (one event each)"
    )


class ClaimCheckConfig(_Frozen):
    """The ``[destinations.NAME.claim_check]`` table: events too large for the
    destination are stored once in a payload store and sent as a reference
    (the claim-check pattern; see :mod:`outrelay.plugins.claimcheck` and
    docs/claim-check.md). Off unless the table is present.
    """

    store: str = Field(
        description="where payloads are stored: `file:///absolute/dir`, `s3://bucket/prefix` (boto3, the SDK's "
        "credential chain) or `outbox` (table `outrelay_payloads` of the outbox database)"
    )
    threshold: int | None = Field(
        None,
        ge=0,
        description="events whose data is larger than this many bytes are sent as a reference; "
        "default: the transport's largest message (`max_message_bytes`)",
    )
    retention_days: float | None = Field(
        None,
        gt=0,
        description="the relay deletes payloads stored more than this many days ago (consumers must fetch "
        "them sooner); unset: kept for ever (or use the bucket's lifecycle rules)",
    )
    endpoint_url: str | None = Field(None, description="`s3://` stores: a non-AWS endpoint (MinIO, moto)")
    region: str | None = Field(None, description="`s3://` stores: the bucket's region (default: the SDK's)")

    @field_validator("store")
    @classmethod
    def _store_url(cls, v: str) -> str:
        if v == "outbox":
            return v
        scheme, sep, rest = v.partition("://")
        if scheme == "file" and sep and rest.startswith("/"):
            return v
        if scheme == "s3" and sep and rest.split("/", 1)[0]:
            return v
        raise ValueError(f"store {v!r} is not a payload store: give file:///absolute/dir, s3://bucket/prefix or outbox")


class DestinationConfig(BaseModel):
    """A destination: a transport plus its options.

    Common options are fields here; every other key is the transport's own
    and is kept in :attr:`options` for its config model.
    """

    model_config = ConfigDict(frozen=True, extra="allow")

    transport: str
    enabled: bool = True
    batch_size: int = Field(100, ge=1, le=10_000)
    max_in_flight: int = Field(4, ge=1, le=256, description="batches sent concurrently")
    per_stream: int = Field(
        16, ge=1, le=10_000, description="events of one stream per batch (if the transport orders batches)"
    )
    retry: RetryPolicy = RetryPolicy()
    attempt_timeout: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="seconds one delivery attempt (a whole batch's transport.send) may take; then every message "
        "of the batch is retried later and the destination's other streams keep flowing",
    )
    tenants: tuple[str, ...] = Field(
        (),
        description="if set, only events of these tenants are ever sent here, whatever the routes say "
        "(events without a tenant neither)",
    )
    breaker: BreakerConfig | None = Field(
        None, description="the `[destinations.NAME.breaker]` table: a circuit breaker (off when absent)"
    )
    claim_check: ClaimCheckConfig | None = Field(
        None,
        description="the `[destinations.NAME.claim_check]` table: large events sent as a reference to a payload "
        "store (off when absent)",
    )

    @property
    def options(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class RouteConfig(_Frozen):
    """Which events go where. Empty filters match everything."""

    types: tuple[str, ...] = ("*",)
    tenants: tuple[str, ...] = ()
    streams: tuple[str, ...] = ()
    labels: dict[str, str] = Field(default_factory=dict)
    tags: tuple[str, ...] = ()
    destinations: tuple[str, ...]
    on_exhausted: Literal["dead-letter", "park"] = "dead-letter"

    @field_validator("destinations")
    @classmethod
    def _non_empty(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if not v:
            raise ValueError("a route needs at least one destination")
        return v


class OutboxConfig(_Frozen):
    url: str = "sqlite:///outbox.db"
    retention_days: float | None = Field(
        None, ge=0, description="delete delivered events older than this; None keeps all (replay reads history)"
    )
    retention_per_stream: int | None = Field(
        None, ge=1, description="keep only the newest N events of each stream once delivered; None: no count limit"
    )
    max_event_bytes: int | None = Field(
        8 * 1024 * 1024,
        ge=1,
        description="append refuses events whose data is larger (EventError); None: no limit",
    )

    @field_validator("url")
    @classmethod
    def _url_port(cls, v: str) -> str:
        problem = endpoint_problem(v)
        if problem:
            raise ValueError(problem)
        return v


class RelayConfig(_Frozen):
    poll_interval: float = Field(0.5, gt=0, le=60)
    route_batch: int = Field(1000, ge=1, le=100_000)
    lease_seconds: float = Field(60.0, ge=1, le=3600)
    shutdown_grace: float = Field(10.0, ge=0, le=600)
    max_batch_bytes: int = Field(
        4 * 1024 * 1024, ge=1, description="a claim stops at this many bytes of event data (one event always fits)"
    )
    max_in_flight_bytes: int = Field(
        32 * 1024 * 1024, ge=1, description="event data bytes claimed and not yet settled, all destinations together"
    )
    linger: float = Field(
        0.004,
        ge=0,
        le=0.1,
        description="seconds a routing waits for more appends when the last one began less than this long ago and "
        "found no backlog: under steady load (hundreds of appends/s and more) a few milliseconds of appends share "
        "one store round for at most this much latency; appends further apart never wait; 0 turns it off",
    )
    drain_retry_bound: float = Field(
        30.0, ge=0, le=3600, description="--drain waits for retries due within this many seconds"
    )
    gc_threshold: int | None = Field(
        20_000,
        ge=100,
        description="while the relay runs, the cyclic garbage collector's first threshold (Python's default is "
        "700): the relay allocates many short-lived objects per event and few cycles, and collecting less often "
        "cut its CPU per event by ~15% in benchmarks/bench_core.py; None leaves the process's setting alone",
    )


class BusConfig(_Frozen):
    """The ``[bus]`` table: where subscribers consume (see :mod:`outrelay.core.consumer.bus`).

    ``destination`` names a configured destination whose transport offers
    subscriptions; ``$OUTRELAY_BUS`` overrides it; with neither, the
    in-process bus. ``dead_letters`` is the database of consumer dead letters
    (default: the outbox's). ``claim_timeout``: seconds after which a dead
    group member's unacknowledged events move to a live one.
    """

    destination: str | None = None
    dead_letters: str | None = None
    claim_timeout: float = Field(30.0, ge=0.5, le=3600)

    @field_validator("dead_letters")
    @classmethod
    def _url_port(cls, v: str | None) -> str | None:
        problem = endpoint_problem(v) if v else None
        if problem:
            raise ValueError(problem)
        return v


class AuditConfig(_Frozen):
    """The ``[audit]`` table: the tamper-evident audit chain (see :mod:`outrelay.core.history.audit`).

    Off by default (costs nothing then). ``hmac_key`` names where the key is,
    never the key itself, so the config can be shown and logged safely.
    """

    enabled: bool = Field(
        False,
        description="record appends and deliveries (one record per batch), dead letters and operator actions "
        "in the outbox's `outrelay_audit` hash chain; `outrelay audit verify` checks it",
    )
    hmac_key: str | None = Field(
        None,
        description="`env:VAR` or `file:/path` holding a secret of 16+ bytes: each record then also carries an "
        "HMAC-SHA256, so an edit re-hashed by someone without the key is caught too; unset: hashes only",
    )

    @field_validator("hmac_key")
    @classmethod
    def _key_ref(cls, v: str | None) -> str | None:
        # never echo the value: it may be a key pasted in by mistake
        if v is not None and not (v.startswith(("env:", "file:")) and v.partition(":")[2]):
            raise ValueError("must be env:VAR or file:/path (where the key is, not the key itself)")
        return v


class AttemptsConfig(_Frozen):
    """The ``[attempts]`` table: the delivery-attempt log (see :mod:`outrelay.core.relay.attempts`).

    One row per attempt of an event to a destination, written in the settle
    transaction; ``outrelay attempts`` reads it, ``outrelay retry`` re-sends one event.
    """

    enabled: bool = Field(
        False,
        description="record every delivery attempt (time, outcome, latency, the transport's detail) in the "
        "outbox table `outrelay_attempts` (about one more row written per event: +4-13 % relay CPU on a drain); "
        "false, the default, writes nothing and costs nothing",
    )
    keep_days: float | None = Field(
        7.0, gt=0, description="the relay deletes attempts older than this many days; None keeps them by age"
    )
    keep_per_event: int | None = Field(
        20,
        ge=1,
        description="at most this many attempts are kept per event and destination (the newest); None: no limit",
    )
    detail_bytes: int = Field(
        512, ge=0, le=65536, description="a transport's detail (e.g. a webhook's answer excerpt) is cut to this size"
    )


class OutrelayConfig(_Frozen):
    outbox: OutboxConfig = OutboxConfig()
    relay: RelayConfig = RelayConfig()
    bus: BusConfig = BusConfig()
    audit: AuditConfig = AuditConfig()
    attempts: AttemptsConfig = AttemptsConfig()
    destinations: dict[str, DestinationConfig] = Field(default_factory=dict)
    routes: tuple[RouteConfig, ...] = ()
    source: str | None = Field(None, description="default event source for `outrelay emit`")

    # The core's tables only. Plugins add theirs through the ``outrelay_config_sections`` hook:
    # :func:`config_model` builds the model the loader validates with, a subclass of this one with
    # one more field per section; a plugin reads its section with :meth:`section`.

    def section(self, name: str, model: type[_S]) -> _S | None:
        """The plugin section ``name`` as ``model`` (the class the plugin registered for it).

        The parsed table when the file has it; else ``model()`` when every field of ``model`` has
        a default (the section is on, with its defaults), else None (an optional table left out).
        A config built without the section (``OutrelayConfig()``, or a model whose registry lacks
        the plugin) answers the same as a file without the table.

        :raises TypeError: the config holds ``name`` as another class than ``model``.
        """
        if name in _CORE_FIELDS:
            raise TypeError(f"[{name}] is a core table, not a plugin section")
        if name not in type(self).model_fields:
            return section_default(model)
        value = getattr(self, name)
        if value is not None and not isinstance(value, model):
            raise TypeError(f"section [{name}] holds a {type(value).__name__}, not a {model.__name__}")
        return value

    @model_validator(mode="after")
    def _check_names(self) -> OutrelayConfig:
        for name in self.destinations:
            if not _NAME_RE.match(name):
                raise ValueError(f"destination name {name!r} must be 1-64 letters, digits, '_', '-' or '.'")
        for i, route in enumerate(self.routes):
            for dest in route.destinations:
                if dest not in self.destinations:
                    known = ", ".join(sorted(self.destinations)) or "none"
                    raise ValueError(f"routes[{i}] names destination {dest!r}, which is not defined (defined: {known})")
        for name in type(self).model_fields:
            check = getattr(getattr(self, name), "check_config", None) if name not in _CORE_FIELDS else None
            if check is not None:  # a plugin section's checks against the rest of the file
                check(self)
        bus = self.bus.destination
        if bus is not None and bus != "memory" and bus not in self.destinations:
            known = ", ".join(sorted(self.destinations)) or "none"
            raise ValueError(f"bus.destination names {bus!r}, which is not defined (defined: {known}, or memory)")
        return self


_CORE_FIELDS = frozenset(OutrelayConfig.model_fields)


def section_default(model: type[_S]) -> _S | None:
    """What a plugin section is when its table is left out: ``model()`` if every field of
    ``model`` has a default, else None (the table is optional and off when absent)."""
    try:
        return model()
    except ValidationError:
        return None


def config_model(registry: Registry | None = None) -> type[OutrelayConfig]:
    """The model a config file is validated with: :class:`OutrelayConfig` plus one field per
    section the plugins of ``registry`` (default: :func:`~outrelay.core.config.registry.get_registry`)
    register, after the core's fields and in plugin order. A section whose model has a default for
    every field defaults to ``model()``, any other to None (optional). The same sections give the
    same class (cached), named ``OutrelayConfig`` like its base, so error messages and the JSON
    Schema read as the core's.

    :raises ConfigError: two plugins register one section, or a section the core holds
        (see :meth:`Registry.config_sections <outrelay.core.config.registry.Registry.config_sections>`).
    """
    if registry is None:
        from outrelay.core.config.registry import get_registry

        registry = get_registry()
    return _root_model(tuple(registry.config_sections(reserved=_CORE_FIELDS).items()))


@functools.lru_cache(maxsize=64)
def _root_model(sections: tuple[tuple[str, type[BaseModel]], ...]) -> type[OutrelayConfig]:
    if not sections:
        return OutrelayConfig
    fields: dict[str, Any] = {}
    for name, model in sections:
        default = section_default(model)
        fields[name] = (model, default) if default is not None else (model | None, None)
    return create_model("OutrelayConfig", __base__=OutrelayConfig, __module__=OutrelayConfig.__module__, **fields)


def interpolate(value: Any, where: str = "") -> Any:
    """Replace ``${VAR}`` / ``${VAR:-default}`` in every string, recursively.

    :raises ConfigError: naming the key when a variable is unset and has no default.
    """
    if isinstance(value, str):

        def sub(m: re.Match[str]) -> str:
            name, default = m.group(1), m.group(2)
            if name in os.environ:
                return os.environ[name]
            if default is not None:
                return default
            raise ConfigError(
                f"environment variable {name} is not set; export it or write ${{{name}:-default}}", where=where
            )

        return _ENV_RE.sub(sub, value)
    if isinstance(value, Mapping):
        return {k: interpolate(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, f"{where}[{i}]") for i, v in enumerate(value)]
    return value


def default_config_path() -> Path:
    return Path(os.environ.get("OUTRELAY_CONFIG") or "outrelay.toml")


def load_config(path: str | os.PathLike[str] | None = None, *, registry: Registry | None = None) -> OutrelayConfig:
    """Read, interpolate and validate a config file, with the sections of ``registry``'s plugins
    (default: the process's registry; see :func:`config_model`).

    :raises ConfigError: missing file, text that is not UTF-8, TOML syntax error (with
        line), unset variable, or invalid value (a URL's port out of range included) —
        one line naming file and key.
    """
    p = Path(path) if path is not None else default_config_path()
    try:
        text = p.read_bytes().decode("utf-8-sig")  # a byte-order mark some editors write is fine
    except UnicodeDecodeError as exc:
        line = exc.object[: exc.start].count(b"\n") + 1
        raise ConfigError(
            f"not UTF-8 text: byte 0x{exc.object[exc.start]:02x} on line {line} (offset {exc.start}); "
            "save the file as UTF-8",
            where=str(p),
        ) from None
    except FileNotFoundError:
        raise ConfigError(
            "config file not found; pass --config FILE, set OUTRELAY_CONFIG, or run `outrelay demo` for an example",
            where=str(p),
        ) from None
    except OSError as exc:
        raise ConfigError(f"cannot read config file: {exc.strerror}", where=str(p)) from None
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"invalid TOML: {exc}", where=str(p)) from None
    return parse_config(raw, where=str(p), registry=registry)


def parse_config(
    raw: Mapping[str, Any], *, where: str = "<config>", registry: Registry | None = None
) -> OutrelayConfig:
    """Validate an already-parsed mapping (see :func:`load_config`): the core's tables and the
    sections ``registry``'s plugins register (:func:`config_model`); any other table is an unknown
    option.

    :raises ConfigError: an unset variable, an invalid value, or a plugin registering a section twice.
    """
    try:
        data = interpolate(raw)
    except ConfigError as exc:
        raise ConfigError(str(exc), where=where) from None
    model = config_model(registry)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(exc), where=where) from None
