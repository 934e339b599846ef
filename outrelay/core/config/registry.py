"""The plugin registry: transports and stores found through pluggy.

Plugins come from the ``outrelay`` entry-point group; outrelay's own
transports are listed there exactly like a third party's. Setting
``OUTRELAY_DISABLE_PLUGIN_AUTOLOAD=1`` loads only the built-ins
(:data:`DEFAULT_PLUGINS`). ``OUTRELAY_PLUGINS`` names more plugin modules,
comma-separated (``myapp.upcasters,myapp.hooks``), loaded in every process
that builds a registry — the CLI included — without packaging them with an
entry point (it is read even with autoloading disabled). After loading,
``check_pending()`` turns a misspelt hook in a plugin into an error instead
of silence.

One registry per process: :func:`get_registry` builds it on first use (it
imports every plugin, so it reads the environment variables above then) and
hands the same one to every caller after; the CLI, the store opener, the
subscriber runtime and the upcasters all take it from there. A caller that
adds plugins or transports of its own (a relay's metrics and health plugins,
``outrelay conformance --plugin``) works on :meth:`Registry.copy`, so what it
adds stays out of the process's registry.

Tests build their own ``Registry(...)`` (``autoload=False``: the built-ins and
``OUTRELAY_PLUGINS`` only) and pass it down where an API takes one
(``Relay(registry=...)``, ``EventBus.from_config(registry=...)``,
``Upcasters().load_plugins(registry)``); for code that takes none,
``set_registry(reg)`` makes ``reg`` the process's registry and returns the one
it replaces, and ``set_registry(None)`` has the next :func:`get_registry` load
the plugins again (say, after changing ``OUTRELAY_PLUGINS``).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata as md
import os
import threading
from collections.abc import Collection, Mapping
from typing import Any, cast

import pluggy
from pydantic import BaseModel, ValidationError

from outrelay.core.config import hookspecs
from outrelay.core.config.endpoints import check_options
from outrelay.core.config.validation import format_validation_error
from outrelay.core.contract.transport import Transport
from outrelay.core.model.errors import ConfigError, MissingExtraError, UnknownTransportError

__all__ = [
    "DEFAULT_PLUGINS",
    "ENTRY_POINT_GROUP",
    "PLUGINS_ENV",
    "Registry",
    "TransportSpec",
    "format_validation_error",
    "get_registry",
    "set_registry",
]

ENTRY_POINT_GROUP = "outrelay"
#: environment variable naming more plugin modules to load (comma-separated import paths)
PLUGINS_ENV = "OUTRELAY_PLUGINS"
DEFAULT_PLUGINS = (
    "outrelay.transports.memory",
    "outrelay.transports.file",
    "outrelay.transports.webhook",
    "outrelay.transports.kafka",
    "outrelay.transports.nats",
    "outrelay.transports.rabbitmq",
    "outrelay.transports.redis",
    "outrelay.transports.aws",
    "outrelay.transports.pubsub",
    "outrelay.transports.servicebus",
    "outrelay.transports.pulsar",
    "outrelay.core.stores.builtin",
    "outrelay.plugins.eventlog",
    "outrelay.plugins.otel",
    "outrelay.plugins.crypto",
    "outrelay.plugins.claimcheck",
)


@dataclasses.dataclass(frozen=True)
class TransportSpec:
    """A registered transport: where its class lives and what it needs."""

    name: str
    target: type[Transport] | str
    requires: tuple[str, ...] = ()
    extra: str | None = None
    origin: str = "outrelay"

    def missing(self) -> list[str]:
        """Client modules that cannot be imported."""
        out = []
        for mod in self.requires:
            try:
                importlib.import_module(mod)
            except ImportError:
                out.append(mod)
        return out

    def load(self) -> type[Transport]:
        """Import the transport class.

        :raises MissingExtraError: when a required client library is missing.
        """
        missing = self.missing()
        if missing:
            hint = f'pip install "outrelay[{self.extra}]"' if self.extra else f"pip install {' '.join(missing)}"
            raise MissingExtraError(
                f"transport {self.name!r} needs {', '.join(missing)}, which is not installed: run {hint}"
            )
        if isinstance(self.target, str):
            mod_name, _, attr = self.target.partition(":")
            cls = getattr(importlib.import_module(mod_name), attr)
        else:
            cls = self.target
        if not (isinstance(cls, type) and issubclass(cls, Transport)):
            raise ConfigError(f"transport {self.name!r} from {self.origin} is not a Transport subclass")
        return cls


class Registry:
    """Holds the plugin manager and what plugins registered."""

    def __init__(self, *, autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager("outrelay")
        self.pm.add_hookspecs(hookspecs)
        self.transports: dict[str, TransportSpec] = {}
        self.stores: dict[str, str] = {}
        self._origin = "outrelay"
        self._dists: dict[str, str] = {}
        if autoload is None:
            autoload = not os.environ.get("OUTRELAY_DISABLE_PLUGIN_AUTOLOAD")
        if autoload:
            self._load_entry_points()
        self._load_named(os.environ.get(PLUGINS_ENV, ""))
        for name in DEFAULT_PLUGINS:
            if self.pm.get_plugin(name) is None:
                self.pm.register(importlib.import_module(name), name=name)
        self.pm.check_pending()
        for impl in self.pm.hook.outrelay_add_transports.get_hookimpls():
            self._origin = self._origin_of(impl.plugin_name)
            impl.function(registry=self)
        self._origin = "outrelay"
        self.pm.hook.outrelay_add_stores(registry=self)

    def copy(self) -> Registry:
        """A registry with this one's plugins, transports and stores, loading nothing again: its own
        plugin manager and tables, so plugins registered on ``copy().pm`` and transports added to the
        copy do not reach this registry (nor this one's later additions the copy)."""
        new = object.__new__(Registry)
        new.pm = pluggy.PluginManager("outrelay")
        new.pm.add_hookspecs(hookspecs)
        for name, plugin in self.pm.list_name_plugin():
            new.pm.register(plugin, name=name)
        new.transports = dict(self.transports)
        new.stores = dict(self.stores)
        new._origin = "outrelay"
        new._dists = dict(self._dists)
        return new

    def _load_entry_points(self) -> None:
        for ep in md.entry_points(group=ENTRY_POINT_GROUP):
            if self.pm.get_plugin(ep.value) is not None:
                continue
            try:
                plugin = ep.load()
            except Exception as exc:  # a broken third-party plugin must be named
                raise ConfigError(
                    f"plugin {ep.name!r} ({ep.value}) failed to import: {exc}; "
                    "fix or uninstall it, or set OUTRELAY_DISABLE_PLUGIN_AUTOLOAD=1"
                ) from exc
            self.pm.register(plugin, name=ep.value)
            dist = getattr(ep, "dist", None)
            if dist is not None:
                self._dists[ep.value] = f"{dist.name} {dist.version}"

    def _load_named(self, names: str) -> None:
        """Register the modules ``names`` lists (``OUTRELAY_PLUGINS``), each once."""
        for name in (n.strip() for n in names.split(",")):
            if not name or self.pm.get_plugin(name) is not None:
                continue
            try:
                module = importlib.import_module(name)
            except Exception as exc:  # a typo in the variable must be named, not ignored
                raise ConfigError(
                    f"{PLUGINS_ENV} names {name!r}, which failed to import ({type(exc).__name__}: {exc}); "
                    "fix the module path or the module"
                ) from None
            self.pm.register(module, name=name)

    def _origin_of(self, plugin_name: str) -> str:
        if plugin_name in self._dists:
            return self._dists[plugin_name]
        try:
            return f"outrelay {md.version('outrelay')}" if plugin_name.startswith("outrelay.") else plugin_name
        except md.PackageNotFoundError:
            return "outrelay (source tree)"

    # -- called by plugins ---------------------------------------------------

    def add_transport(
        self,
        name: str,
        target: type[Transport] | str,
        *,
        requires: tuple[str, ...] = (),
        extra: str | None = None,
    ) -> None:
        """Register a transport class (or ``"module:Class"`` path) under ``name``."""
        if name in self.transports and self.transports[name].origin != self._origin:
            raise ConfigError(
                f"transport {name!r} is registered twice ({self.transports[name].origin} and {self._origin}); "
                "uninstall one of them"
            )
        self.transports[name] = TransportSpec(name, target, tuple(requires), extra, self._origin)

    def add_store(self, scheme: str, target: str) -> None:
        """Register an outbox store (``"module:Class"``) for a URL scheme."""
        self.stores[scheme] = target

    # -- used by outrelay ----------------------------------------------------

    def config_sections(self, *, reserved: Collection[str] = ()) -> dict[str, type[BaseModel]]:
        """Every config section the plugins register (hook ``outrelay_config_sections``): name ->
        model, in plugin registration order. Asks the plugins on every call (a plugin registered on
        ``pm`` later counts); the config loader caches the model it builds from the answer.

        :raises ConfigError: a name that is no identifier or starts with ``_``, a value that is not
            a pydantic model class, a name in ``reserved`` (the core's tables), or one name
            registered by two plugins with different models — naming the plugins.
        """
        out: dict[str, type[BaseModel]] = {}
        owner: dict[str, str] = {}
        for impl in self.pm.hook.outrelay_config_sections.get_hookimpls():
            plugin = self._dists.get(impl.plugin_name, impl.plugin_name)
            answer = cast("Mapping[object, object] | None", impl.function())
            for name, model in (answer or {}).items():
                if not (isinstance(name, str) and name.isidentifier() and not name.startswith("_")):
                    raise ConfigError(f"plugin {plugin} registers config section {name!r}, which is no identifier")
                if not (isinstance(model, type) and issubclass(model, BaseModel)):
                    raise ConfigError(f"plugin {plugin} registers config section [{name}] as {model!r}, not a model")
                if name in reserved:
                    raise ConfigError(f"plugin {plugin} registers config section [{name}], which is outrelay's own")
                if name in out and out[name] is not model:
                    raise ConfigError(
                        f"config section [{name}] is registered twice ({owner[name]} and {plugin}); "
                        "uninstall one of them"
                    )
                out[name], owner[name] = model, plugin
        return out

    def transport_spec(self, name: str) -> TransportSpec:
        try:
            return self.transports[name]
        except KeyError:
            known = ", ".join(sorted(self.transports)) or "none"
            raise UnknownTransportError(
                f"unknown transport {name!r}; installed transports: {known} "
                "(a third-party transport must be installed as a package with an 'outrelay' entry point)"
            ) from None

    def create_transport(self, name: str, options: Mapping[str, Any], *, destination: str) -> Transport:
        """Validate ``options`` with the transport's config model, and every address in them
        (:func:`~outrelay.core.config.endpoints.check_options`: a port no socket can use), and build it.

        :raises ConfigError: unknown transport, missing extra or invalid options.
        """
        where = f"destinations.{destination}"
        try:
            cls = self.transport_spec(name).load()
        except ConfigError as exc:  # unknown transport, missing extra: say which destination names it
            raise type(exc)(str(exc), where=where) from None
        try:
            config = cls.Config.model_validate(dict(options))
        except ValidationError as exc:
            raise ConfigError(format_validation_error(exc), where=where) from None
        check_options(options, where=where)
        return cls(config, destination=destination)


_default: Registry | None = None
_default_lock = threading.RLock()  # a plugin that asks for the registry while it is built gets no deadlock


def get_registry() -> Registry:
    """The process's plugin registry, built (``Registry()``: every installed plugin loaded, then
    ``check_pending()``) by the first call and the same object for every call after.

    :raises ConfigError: on the call that builds it, a plugin that fails to import, a module
        ``OUTRELAY_PLUGINS`` names that cannot be imported, or a transport name two distributions
        register; the next call tries again.
    """
    global _default
    if _default is None:
        with _default_lock:
            if _default is None:
                _default = Registry()
    return _default


def set_registry(registry: Registry | None) -> Registry | None:
    """Make ``registry`` what :func:`get_registry` returns from now on (``None``: the next call
    builds a new one); returns the registry it replaces (``None`` if none was built yet), so a
    test can put it back."""
    global _default
    with _default_lock:
        previous, _default = _default, registry
    return previous
