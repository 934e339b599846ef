"""The conformance config file, and the hooks ``outrelay conformance`` derives from it.

``outrelay conformance --conformance-config FILE`` reads a TOML file whose
``[conformance]`` table gives every :class:`~outrelay.conformance.ConformanceTarget`
hook without writing a test module (all keys optional)::

    [conformance]
    label = "carrier (real server 2.1)"
    timeout = 10                              # each open/send/close/check call (s)
    read_timeout = 10                         # reading back (s)
    isolate = true                            # try a fresh target per check
    unreachable = { port = 1 }                # option overrides: a broker that is down
    endpoint = "url"                          # the option naming the broker: a URL (or host:port, or a list
                                              # of them) the suite rewrites to its fault proxy; or ["host", "port"]
    forbidden = { username = "ro" }           # option overrides: credentials that connect but may not publish
    refused_target = "orders.missing"         # a target the broker refuses per message
    secret_option = "password"                # the option holding a secret (or: secret = "...")
    binding = "kafka"                         # http, kafka, amqp, mqtt, nats, structured, or a table of Binding fields
    late_reader = { from_beginning = true }   # reader options: a reader that sees what was sent before it started
    unsupported = { throttle = "the broker never throttles with a retry hint" }
    hooks = "my_pkg.conformance:hooks"        # code hooks: hooks(build) -> {"throttle": ..., "provision": ...}

``hooks`` names a function called with ``build(overrides) -> Transport``
(the destination with option overrides) that returns further
ConformanceTarget fields — the hooks only code can give (``throttle``,
``provision``, ``cleanup``, ``refuse_target``...). Command-line options win
over the file. Every problem is a :class:`~outrelay.ConfigError` naming the
file and the key.
"""

from __future__ import annotations

import dataclasses
import importlib
import tomllib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from outrelay.conformance._binding import AMQP, HTTP, KAFKA, MQTT, NATS, STRUCTURED, Binding
from outrelay.core.contract.transport import Reader, Transport
from outrelay.core.model.errors import ConfigError

__all__ = ["RunnerHooks", "endpoint_fields", "hook_fields", "load_hooks"]

BINDINGS = {b.name: b for b in (AMQP, HTTP, KAFKA, MQTT, NATS, STRUCTURED)}
#: the port a URL without one means, per scheme
DEFAULT_PORTS = {"amqp": 5672, "amqps": 5671, "http": 80, "https": 443, "kafka": 9092, "mqtt": 1883, "nats": 4222,
                 "pulsar": 6650, "redis": 6379, "rediss": 6379, "tcp": None, "tls": 4222}  # fmt: skip
_MAPPINGS = ("unreachable", "forbidden", "late_reader", "unsupported")


@dataclasses.dataclass(frozen=True)
class RunnerHooks:
    """What a conformance config file says (see the module docstring); ``None``: not given."""

    label: str | None = None
    timeout: float | None = None
    read_timeout: float | None = None
    isolate: bool | None = None
    unreachable: Mapping[str, Any] | None = None
    endpoint: tuple[str, ...] | None = None
    forbidden: Mapping[str, Any] | None = None
    refused_target: str | None = None
    secret: str | None = dataclasses.field(default=None, repr=False)
    secret_option: str | None = None
    binding: Binding | None = None
    late_reader: Mapping[str, Any] | None = None
    unsupported: Mapping[str, str] = dataclasses.field(default_factory=dict)
    hooks: str | None = None


def load_hooks(path: str | Path) -> RunnerHooks:
    """Read the ``[conformance]`` table of ``path``. :raises ConfigError: unreadable, or a bad key or value."""
    where = str(path)
    try:
        doc = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read the conformance config: {exc}", where=where) from None
    table = doc.get("conformance", doc)
    if not isinstance(table, dict):
        raise ConfigError("[conformance] must be a table", where=where)
    known = {f.name for f in dataclasses.fields(RunnerHooks)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}", where=where)
    values = dict(table)
    for key in _MAPPINGS:
        if key in values and not isinstance(values[key], dict):
            raise ConfigError(f"{key} must be a table, e.g. {key} = {{ name = value }}", where=where)
    if "endpoint" in values:
        values["endpoint"] = _endpoint(values["endpoint"], where)
    if "binding" in values:
        values["binding"] = _binding(values["binding"], where)
    for key, kind in (("timeout", (int, float)), ("read_timeout", (int, float)), ("isolate", bool)):
        if key in values and not isinstance(values[key], kind):
            raise ConfigError(f"{key} = {values[key]!r} is not a {'number' if key != 'isolate' else 'boolean'}",
                              where=where)  # fmt: skip
    return RunnerHooks(**values)


def _endpoint(value: Any, where: str) -> tuple[str, ...]:
    names = (value,) if isinstance(value, str) else tuple(value) if isinstance(value, list) else ()
    if len(names) not in (1, 2) or not all(isinstance(n, str) and n for n in names):
        raise ConfigError(f'endpoint = {value!r}: name the URL option ("url") or the host and port options '
                          '(["host", "port"])', where=where)  # fmt: skip
    return names


def _binding(value: Any, where: str) -> Binding:
    if isinstance(value, str):
        if value.lower() not in BINDINGS:
            raise ConfigError(f"binding = {value!r}: known are {', '.join(BINDINGS)} (or a table)", where=where)
        return BINDINGS[value.lower()]
    try:
        return Binding(**value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"binding: {exc}", where=where) from None


# -- the fault proxy: where the broker is, and the destination pointed elsewhere ---------------------------------


def _split(value: str, option: str) -> tuple[str, int]:
    """(host, port) of a URL or ``host:port``. :raises ConfigError: no host, or no port and no known default."""
    if "://" in value:
        parts = urlsplit(value)
        port = parts.port or DEFAULT_PORTS.get(parts.scheme.lower())
        host = parts.hostname
    else:
        host, _, text = value.rpartition(":")
        port = int(text) if text.isdigit() else None
    if not host or not port:
        raise ConfigError(f"endpoint option {option!r} = {value!r} names no host and port; write them, e.g. "
                          "scheme://host:port")  # fmt: skip
    return host.strip("[]"), int(port)


def _moved(value: str, host: str, port: int) -> str:
    """``value`` (a URL or ``host:port``) pointed at ``host:port``, credentials, path and query kept."""
    if "://" not in value:
        return f"{host}:{port}"
    parts = urlsplit(value)
    auth = parts.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{auth}@{host}:{port}" if auth else f"{host}:{port}"))


def endpoint_fields(
    names: Sequence[str], options: Mapping[str, Any], defaults: Mapping[str, Any], per_check: Callable[..., Transport]
) -> dict[str, Any]:
    """``upstream`` and ``make_transport_via`` for the fault checks. ``names``: the host and port options, or
    the one option holding a URL / ``host:port`` / a list of them (every entry then points at the proxy).
    ``per_check(target, overrides)`` builds the destination for a check's target.

    :raises ConfigError: the options have no value, or the URL no port."""
    values = {n: options.get(n, defaults.get(n)) for n in names}
    if any(v is None for v in values.values()):
        raise ConfigError(f"endpoint option(s) {', '.join(map(repr, names))} have no value")
    if len(names) == 2:
        host_opt, port_opt = names
        host, port = str(values[host_opt]), int(values[port_opt])
        return {
            "upstream": lambda _target: (host, port),
            "make_transport_via": lambda target, h, p: per_check(target, {host_opt: h, port_opt: p}),
        }
    [option] = names
    value = values[option]
    many = isinstance(value, list | tuple)
    first = str(value[0]) if many and value else str(value)
    upstream = _split(first, option)

    def via(target: str, h: str, p: int) -> Transport:
        moved: Any = [_moved(str(v), h, p) for v in value] if many else _moved(first, h, p)
        return per_check(target, {option: moved})

    return {"upstream": lambda _target: upstream, "make_transport_via": via}


def hook_fields(
    hooks: RunnerHooks,
    per_check: Callable[[str, Mapping[str, Any]], Transport],
    build: Callable[[Mapping[str, Any]], Transport],
    options: Mapping[str, Any],
) -> dict[str, Any]:
    """The ConformanceTarget fields the file gives besides the endpoint: forbidden credentials, a refused
    target, the secret, the binding, a late reader, declared limitations, and the code hooks.
    ``per_check(target, overrides)`` builds the destination for a check's target, ``build(overrides)`` as is.

    :raises ConfigError: ``secret_option`` names no option, ``hooks`` cannot be imported or returns no mapping."""
    out: dict[str, Any] = {"unsupported": dict(hooks.unsupported)} if hooks.unsupported else {}
    if hooks.forbidden is not None:
        forbidden = dict(hooks.forbidden)
        out["make_forbidden"] = lambda target: per_check(target, forbidden)
    if hooks.refused_target is not None:
        refused = hooks.refused_target

        async def refuse(_target: str) -> str:
            return refused

        out["refuse_target"] = refuse
    secret = hooks.secret
    if hooks.secret_option is not None:
        if options.get(hooks.secret_option) in (None, ""):
            raise ConfigError(f"secret_option = {hooks.secret_option!r}: the destination has no such option set")
        secret = str(options[hooks.secret_option])
    if secret:
        out["secret"] = secret
    if hooks.binding is not None:
        out["binding"] = hooks.binding
    if hooks.late_reader is not None:
        late = dict(hooks.late_reader)
        out["late_reader"] = lambda t, target: _reader(t, target, late)
    if hooks.hooks is not None:
        out.update(_code_hooks(hooks.hooks, build))
    return out


def _reader(t: Transport, target: str, options: Mapping[str, Any]) -> Reader:
    return t.reader(target, **options)


def _code_hooks(spec: str, build: Callable[[Mapping[str, Any]], Transport]) -> Mapping[str, Any]:
    module, _, attr = spec.partition(":")
    try:
        func = getattr(importlib.import_module(module), attr or "hooks")
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"hooks = {spec!r}: cannot import it ({exc}); write module:function") from None
    fields = func(build)
    if not isinstance(fields, Mapping):
        raise ConfigError(
            f"hooks = {spec!r} returned {type(fields).__name__}, not a mapping of ConformanceTarget fields"
        )
    return fields
