"""Run the conformance suite against a destination of a config file.

``outrelay conformance --config FILE --destination NAME`` calls
:func:`run_conformance`, which builds the destination's transport the way
the relay does (``Registry.create_transport``) and runs the suite on it
through ``pytest.main`` with a generated test module.

Per-check targets. The suite wants a fresh target (topic, subject, queue,
file...) per check. The runner makes one by rebuilding the transport from
the configured options with its *target option* replaced:

* a transport class may name that option: ``conformance_target_option:
  ClassVar[str] = "topic"``;
* otherwise it is the first of :data:`TARGET_OPTIONS` its config model has.

Because the runner cannot provision (create topics, queues, grant
permissions), it first probes: it sends one event to a fresh target and
reads it back. If that fails (the broker wants targets provisioned, the
credentials may only publish to the configured target, ...), or the
transport has no target option or no reader, every check uses the
configured target as is (``isolated=False``: readers ignore messages the
check did not send; checks that need a target of their own skip with the
reason). The label in the report says which mode ran. Per-check targets
(``orconf-<check>-<uuid8>``, and the probe's ``orconf-probe-<uuid8>``) stay
behind on the broker: delete them afterwards if the broker keeps them.

A transport without a broker to read back from (webhooks) may give a
classmethod ``conformance_local_peer(config)``: the runner then starts that
peer per check and points a copy of the destination at it, and the label
(printed first, and in the report) says so.

Broker-down checks need an endpoint where nothing listens: give the option
overrides with ``unreachable`` (CLI: ``--unreachable port=1``), or a
transport class may declare them once as ``conformance_unreachable_options:
ClassVar[Mapping[str, Any]]`` (e.g. ``{"bootstrap_servers": "127.0.0.1:1"}``);
without either those checks skip with the reason. The fault checks (a TCP
proxy that cuts, resets, stalls or black-holes the connection) need the
names of the host and port options: ``endpoint=("host", "port")`` (CLI:
``--endpoint host,port``) or ``conformance_endpoint_options: ClassVar[tuple[str, str]]``;
for a transport configured by URL, the one option holding it
(``--endpoint url``): the runner rewrites the URL's host and port to its proxy.

Every other hook (forbidden credentials, a refused target, the secret, the
binding, a late reader, declared limitations, code hooks) comes from a
conformance config file (``conformance_config``, CLI ``--conformance-config``;
see :mod:`outrelay.conformance._runner_hooks`). A class may declare the reader
options of its late reader (the durability check) as
``conformance_late_reader_options: ClassVar[Mapping[str, Any]]``, and what the suite cannot
certify on it (e.g. ``late_reader`` for a broker that keeps nothing for absent readers) as
``conformance_unsupported: ClassVar[Mapping[str, str]]`` (name -> why; a config file's
``unsupported`` adds to it).

Cleanup. A transport class may define ``async def conformance_cleanup(self)
-> None``: delete what was created under its configured target (a Redis
stream, a topic, a queue). The runner then calls it, on an opened transport
built for that target, after every check for each per-check target and after
the probe, so a run leaves nothing behind.

Foreign messages. For the consumer-side check ``subscription_foreign_message``
a transport class may define ``async def conformance_publish_foreign(self) ->
None``: put on its configured target a message that is not an outrelay
CloudEvent, with the broker's own client. The runner calls it on an opened
transport built for the check's target; without it that check skips.

Transports that are not installed. ``plugins`` (CLI: ``--plugin``, repeatable)
loads a transport without packaging it: ``package.module:Class`` registers
that class under its ``name``; ``package.module`` or ``path/to/file.py``
registers what the module's ``outrelay_add_transports`` hook adds, or else
every Transport subclass it defines. Without a config file, ``transport``
and ``options`` (CLI: ``--option key=value``) describe the destination inline.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import importlib.metadata as md
import importlib.util
import inspect
import sys
import tempfile
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from outrelay.conformance._harness import EVENT_TYPE, SOURCE
from outrelay.conformance._runner_hooks import RunnerHooks, endpoint_fields, hook_fields, load_hooks
from outrelay.conformance._target import ConformanceTarget
from outrelay.core.config.config import load_config
from outrelay.core.config.registry import Registry, get_registry
from outrelay.core.contract.transport import Delivered, Message, Transport
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import ConfigError

__all__ = ["TARGET_OPTIONS", "build_target", "load_plugin", "run_conformance", "target_option"]

TARGET_OPTIONS = ("target", "topic", "subject", "stream", "queue", "queue_name", "channel", "routing_key", "path")
_MODULE = '''"""Generated by outrelay.conformance.runner."""
from outrelay.conformance import ConformanceSuite


class TestDestination(ConformanceSuite):
    """The suite against the configured destination (fixture from the runner plugin)."""
'''


def target_option(cls: type[Transport]) -> str | None:
    """The config option holding ``cls``'s target, or ``None`` if unknown."""
    explicit = getattr(cls, "conformance_target_option", None)
    if isinstance(explicit, str) and explicit:
        return explicit
    fields = getattr(cls.Config, "model_fields", {})
    return next((name for name in TARGET_OPTIONS if name in fields), None)


def _per_check_value(option: str, configured: Any, name: str) -> str:
    """A per-check target value: a bare name, or for a path a file next to the configured one."""
    text = str(configured or "")
    if option == "path" or ("/" in text and "://" not in text):
        p = Path(text)
        return str(p.parent / f"{name}{p.suffix}")
    return name


def _import(where: str, spec: str) -> ModuleType:
    """Import a dotted module name, or a ``.py`` file by path (``spec``: the whole --plugin, for messages)."""
    if where.endswith(".py") or "/" in where or "\\" in where:
        path = Path(where).resolve()
        if not path.is_file():
            raise ConfigError(f"--plugin {spec!r}: no such file {where!r}")
        name = f"outrelay_conformance_plugin_{path.stem}"
        loader = importlib.util.spec_from_file_location(name, path)
        if loader is None or loader.loader is None:
            raise ConfigError(f"--plugin {spec!r}: cannot import this file as a Python module")
        module = importlib.util.module_from_spec(loader)
        sys.modules[name] = module
        sys.path.insert(0, str(path.parent))  # so the file's own sibling imports work
        try:
            loader.loader.exec_module(module)
        finally:
            sys.path.remove(str(path.parent))
        return module
    try:
        return importlib.import_module(where)
    except ImportError as exc:
        raise ConfigError(
            f"--plugin {spec!r}: cannot import it ({exc}); run from its project directory or put it on PYTHONPATH"
        ) from None


def load_plugin(spec: str, registry: Registry) -> list[str]:
    """Register the transport(s) of ``spec`` (``module:Class``, ``module`` or ``file.py[:Class]``) with
    ``registry``; returns their names.

    :raises ConfigError: the module cannot be imported, or holds no such Transport class.
    """
    where, _, attr = spec.rpartition(":") if spec.count(":") and not spec.endswith(".py") else (spec, "", "")
    if len(where) == 1 and where.isalpha():  # a Windows drive letter, not module:Class
        where, attr = spec, ""
    module = _import(where, spec)
    found: dict[str, tuple[type[Transport] | str, dict[str, Any]]] = {}
    if attr:
        cls = getattr(module, attr, None)
        if not (isinstance(cls, type) and issubclass(cls, Transport)):
            raise ConfigError(f"--plugin {spec!r}: {attr!r} is not a Transport subclass of {module.__name__}")
        found[cls.name] = (cls, {})
    elif callable(hook := getattr(module, "outrelay_add_transports", None)):
        hook(registry=_Recorder(found))
    else:
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, Transport) and cls.__module__ == module.__name__ and not inspect.isabstract(cls):
                found[cls.name] = (cls, {})
    if not found:
        raise ConfigError(f"--plugin {spec!r}: the module registers no transport and defines no Transport subclass")
    for name, (target, kwargs) in found.items():
        registry.transports.pop(name, None)  # an explicit --plugin wins over an installed one of that name
        registry.add_transport(name, target, **kwargs)
    return sorted(found)


class _Recorder:
    """Stands in for the registry when a plugin module's hook runs: records what it adds."""

    def __init__(self, found: dict[str, tuple[type[Transport] | str, dict[str, Any]]]) -> None:
        self._found = found

    def add_transport(self, name: str, target: type[Transport] | str, **kwargs: Any) -> None:
        self._found[name] = (target, kwargs)

    def add_store(self, scheme: str, target: str) -> None:
        """Stores are not what a conformance run needs."""


def parse_option(text: str) -> tuple[str, Any]:
    """``key=value`` with the value read as TOML (``5``, ``true``, ``"x"``, ``[1, 2]``), else as a string.

    :raises ConfigError: no ``=``.
    """
    import tomllib

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"option {text!r} is not key=value; e.g. --option topic=orders")
    try:
        parsed: Any = tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        parsed = value
    return key.strip(), parsed


def _class_hook(build: Callable[[str], Transport], timeout: float, method: str) -> Callable[[str], Awaitable[None]]:
    """A target hook (``cleanup``, ``publish_foreign``) from the transport class's ``method``
    (``conformance_cleanup``, ``conformance_publish_foreign``), awaited on an opened transport built for
    the target; nothing when the class has no such method."""

    async def cleanup(target: str) -> None:
        t = build(target)
        call = getattr(t, method, None)
        if call is None:
            return
        await asyncio.wait_for(t.open(), timeout)
        try:
            await asyncio.wait_for(call(), timeout)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(t.close(), timeout)

    return cleanup


class _RunnerPlugin:
    """Provides the ``conformance_target`` fixture to the generated module."""

    def __init__(self, target: ConformanceTarget) -> None:
        self._target = target

    @pytest.fixture
    def conformance_target(self) -> ConformanceTarget:
        return self._target


async def _probe(
    make: Callable[[str], Transport],
    read_timeout: float,
    timeout: float,
    cleanup: Callable[[str], Awaitable[None]] | None = None,
) -> str | None:
    """Send one event to a fresh target and read it back; ``None`` on success, else why not."""
    name = f"orconf-probe-{uuid.uuid4().hex[:8]}"
    try:
        return await _probe_once(make(name), read_timeout, timeout)
    finally:
        if cleanup is not None:
            with contextlib.suppress(Exception):
                await cleanup(name)


async def _probe_once(t: Transport, read_timeout: float, timeout: float) -> str | None:
    ev = Event(type=EVENT_TYPE, stream="probe", source=SOURCE, data=b"probe")
    try:
        await asyncio.wait_for(t.open(), timeout)
        async with t.reader(t.target(ev)) as reader:
            [result] = await asyncio.wait_for(t.send([Message(ev, t.target(ev), ev.stream)]), timeout)
            if not isinstance(result, Delivered):
                return f"a fresh target gave {result!r}"
            got = await asyncio.wait_for(reader.read(1, read_timeout), read_timeout + timeout)
            if not any(r.event.id == ev.id for r in got):
                return "an event sent to a fresh target was not read back"
        return None
    except Exception as exc:  # any failure just means: use the configured target
        return f"a fresh target failed: {type(exc).__name__}"
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(t.close(), timeout)


def build_target(
    config_path: str | None,
    destination: str | None,
    *,
    isolate: bool | None = None,
    read_timeout: float | None = None,
    timeout: float | None = None,
    plugins: Sequence[str] = (),
    transport: str | None = None,
    options: Mapping[str, Any] | None = None,
    unreachable: Mapping[str, Any] | None = None,
    endpoint: tuple[str, ...] | None = None,
    hooks: RunnerHooks | None = None,
) -> ConformanceTarget:
    """The :class:`ConformanceTarget` for a destination (see the module docstring).

    Either ``config_path`` and ``destination`` (a configured destination), or
    no config and ``transport``/``options`` inline (``transport`` defaults to the
    one transport ``plugins`` registered). ``unreachable`` overrides the class's
    ``conformance_unreachable_options``; ``endpoint`` (the names of the host and
    port options, or of one option holding a URL) overrides
    ``conformance_endpoint_options`` and enables the fault checks, which put a
    TCP proxy between transport and broker. ``hooks`` is a conformance config
    file's content (:func:`~outrelay.conformance._runner_hooks.load_hooks`);
    the arguments given here win over it. Timeouts default to 10 s.

    :raises ConfigError: no such destination, unknown transport, missing extra, invalid options, bad plugin.
    """
    hooks = hooks or RunnerHooks()
    read_timeout = read_timeout or hooks.read_timeout or 10.0
    timeout = timeout or hooks.timeout or 10.0
    isolate = False if isolate is False or hooks.isolate is False else None
    kind, name, options, registry = _destination(config_path, destination, plugins, transport, options)
    base = registry.create_transport(kind, options, destination=name)  # validates the options
    cls = type(base)
    option = target_option(cls)

    def build(overrides: Mapping[str, Any]) -> Transport:
        return registry.create_transport(kind, {**options, **overrides}, destination=name)

    def per_check(target: str, overrides: Mapping[str, Any]) -> Transport:
        assert option is not None
        return build({option: _per_check_value(option, options.get(option), target), **overrides})

    local = getattr(cls, "conformance_local_peer", None)
    if local is not None and isolate is not False:
        peer_target = _local_peer_target(name, kind, local(base.config), build, read_timeout, timeout)
        late_options = getattr(cls, "conformance_late_reader_options", None)
        if late_options is not None:
            return dataclasses.replace(peer_target, late_reader=lambda t, target: t.reader(target, **late_options))
        return peer_target
    cleanup = (
        _class_hook(lambda t: per_check(t, {}), timeout, "conformance_cleanup")
        if option is not None and hasattr(cls, "conformance_cleanup")
        else None
    )
    why = _why_shared(isolate, option, kind, base) or asyncio.run(
        _probe(lambda t: per_check(t, {}), read_timeout, timeout, cleanup)
    )
    why = why or ""
    down = unreachable if unreachable is not None else hooks.unreachable
    down = down if down is not None else getattr(cls, "conformance_unreachable_options", None)
    mode = "per-check targets" if not why else f"configured target as is: {why}"
    common: dict[str, Any] = {
        "label": hooks.label or f"{name} ({kind}; {mode})",
        "read_timeout": read_timeout,
        "timeout": timeout,
    }
    late = getattr(cls, "conformance_late_reader_options", None)
    if late is not None:
        common["late_reader"] = lambda t, target: t.reader(target, **late)
    foreign = hasattr(cls, "conformance_publish_foreign")
    if why:
        if foreign:
            common["publish_foreign"] = _class_hook(lambda _target: build({}), timeout, "conformance_publish_foreign")
        shared = lambda _target, overrides: build(overrides)  # noqa: E731
        base_fields = {
            "make_transport": lambda _target: build({}),
            "make_unreachable": (lambda _target: build(dict(down))) if down is not None else None,
            "isolated": False,
        }
        return _target(_declared(cls, base_fields | common | hook_fields(hooks, shared, build, options)))
    fields: dict[str, Any] = {
        "make_transport": lambda target: per_check(target, {}),
        "make_unreachable": (lambda target: per_check(target, down)) if down is not None else None,
        "cleanup": cleanup,
        **common,
    }
    if foreign:
        fields["publish_foreign"] = _class_hook(lambda t: per_check(t, {}), timeout, "conformance_publish_foreign")
    names = endpoint or hooks.endpoint or _endpoint_names(getattr(cls, "conformance_endpoint_options", None))
    if names:
        defaults = {n: f.default for n, f in cls.Config.model_fields.items()}
        fields |= endpoint_fields(names, options, defaults, per_check)
    return _target(_declared(cls, fields | hook_fields(hooks, per_check, build, options)))  # the file's hooks win


def _declared(cls: type, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` with the class's ``conformance_unsupported`` under the ``unsupported`` a config file
    gave (the file's reason wins for a name both declare)."""
    declared = getattr(cls, "conformance_unsupported", None) or {}
    return {**fields, "unsupported": {**declared, **fields.get("unsupported", {})}} if declared else dict(fields)


def _target(fields: Mapping[str, Any]) -> ConformanceTarget:
    """:raises ConfigError: a field name ConformanceTarget does not have (from a config file's code hooks)."""
    known = {f.name for f in dataclasses.fields(ConformanceTarget)}
    unknown = sorted(set(fields) - known)
    if unknown:
        raise ConfigError(f"unknown ConformanceTarget field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    return ConformanceTarget(**fields)


def _endpoint_names(declared: Any) -> tuple[str, ...] | None:
    """A class's ``conformance_endpoint_options``: ``("host", "port")``, ``("url",)`` or ``"url"``."""
    if isinstance(declared, str):
        return (declared,)
    return tuple(declared) if declared else None


def _why_shared(isolate: bool | None, option: str | None, kind: str, base: Transport) -> str:
    """Why every check must use the configured target as is, before probing ("": probe)."""
    if isolate is False:
        return "per-check targets disabled"
    if option is None:
        return f"transport {kind!r} names no target option (conformance_target_option)"
    if not base.capabilities.reader:
        return "transport has no reader to probe a fresh target with"
    return ""


def _destination(
    config_path: str | None,
    destination: str | None,
    plugins: Sequence[str],
    transport: str | None,
    options: Mapping[str, Any] | None,
) -> tuple[str, str, dict[str, Any], Registry]:
    """(transport kind, destination name, options, registry) of the destination to certify."""
    registry = get_registry().copy()  # --plugin adds and replaces transports: not in the process's registry
    loaded = [name for spec in plugins for name in load_plugin(spec, registry)]
    if config_path is not None:
        config = load_config(config_path)
        if destination is None:
            raise ConfigError("name the destination to certify: --destination NAME", where=str(config_path))
        dest = config.destinations.get(destination)
        if dest is None:
            known = ", ".join(sorted(config.destinations)) or "none"
            raise ConfigError(f"no destination {destination!r} (defined: {known})", where=str(config_path))
        return dest.transport, destination, dict(dest.options), registry
    if transport is None and len(loaded) != 1:
        raise ConfigError(
            "without --config, name the transport: --plugin module:Class (one transport) or --transport NAME"
        )
    kind = transport or loaded[0]
    return kind, destination or kind, dict(options or {}), registry


def _local_peer_target(
    destination: str,
    transport: str,
    peer: Mapping[str, Any],
    build: Callable[[Mapping[str, Any]], Transport],
    read_timeout: float,
    timeout: float,
) -> ConformanceTarget:
    """Checks against a peer the runner starts itself (a transport class's ``conformance_local_peer(config)``:
    ``provision``, the target ``option``, ``overrides``, ``unreachable(name)`` option overrides, a ``note``)."""
    option: str = peer["option"]
    overrides: Mapping[str, Any] = peer.get("overrides", {})
    unreachable: Callable[[str], Mapping[str, Any]] | None = peer.get("unreachable")
    return ConformanceTarget(
        make_transport=lambda target: build({**overrides, option: target}),
        provision=peer["provision"],
        make_unreachable=(lambda name: build({**overrides, **unreachable(name)})) if unreachable else None,
        label=f"{destination} ({transport}; {peer.get('note', 'a local peer per check')})",
        read_timeout=read_timeout,
        timeout=timeout,
    )


def _plugin_arg() -> str:
    """How to load the conformance plugin with ``-p`` whether or not autoload is on."""
    for ep in md.entry_points(group="pytest11"):
        if ep.value == "outrelay.conformance.plugin":
            return ep.name
    return "outrelay.conformance.plugin"


def run_conformance(
    config_path: str | None,
    destination: str | None,
    *,
    report_json: str | None = None,
    report_md: str | None = None,
    extra_pytest_args: Sequence[str] = (),
    isolate: bool | None = None,
    read_timeout: float | None = None,
    timeout: float | None = None,
    plugins: Sequence[str] = (),
    transport: str | None = None,
    options: Mapping[str, Any] | None = None,
    unreachable: Mapping[str, Any] | None = None,
    endpoint: tuple[str, ...] | None = None,
    conformance_config: str | None = None,
) -> int:
    """Run the suite against a destination (see :func:`build_target`); return pytest's exit code.

    ``isolate``: ``None`` probes for per-check targets, ``False`` always uses
    the configured target. ``conformance_config`` is a conformance config file
    giving the test hooks (:mod:`~outrelay.conformance._runner_hooks`). Runs in a
    temporary directory with an empty pytest configuration, so the caller's
    pytest settings do not apply.

    :raises ConfigError: see :func:`build_target`.
    """
    target = build_target(
        config_path,
        destination,
        isolate=isolate,
        read_timeout=read_timeout,
        timeout=timeout,
        plugins=plugins,
        transport=transport,
        options=options,
        unreachable=unreachable,
        endpoint=endpoint,
        hooks=load_hooks(conformance_config) if conformance_config else None,
    )
    print(f"conformance: {target.label}", flush=True)  # says which peer and mode the checks run against
    with tempfile.TemporaryDirectory(prefix="outrelay-conformance-") as tmp:
        root = Path(tmp)
        (root / "pytest.ini").write_text("[pytest]\n", encoding="utf-8")
        # a unique module name: several runs in one process must not collide in sys.modules
        module = root / f"test_outrelay_conformance_{uuid.uuid4().hex[:8]}.py"
        module.write_text(_MODULE, encoding="utf-8")
        args = [
            str(module),
            "-c",
            str(root / "pytest.ini"),
            "--rootdir",
            tmp,
            "-p",
            _plugin_arg(),
            "-p",
            "no:cacheprovider",
            "-p",
            "no:asyncio",
            "--import-mode=importlib",
            "-ra",
        ]
        if report_json:
            args += ["--outrelay-report-json", str(Path(report_json).resolve())]
        if report_md:
            args += ["--outrelay-report-md", str(Path(report_md).resolve())]
        return int(pytest.main([*args, *extra_pytest_args], plugins=[_RunnerPlugin(target)]))
