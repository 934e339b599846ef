"""Plugins own config sections (issue 33): the ``outrelay_config_sections`` hook.

The core's model holds only its own tables; :func:`config_model` adds each section a
registry's plugins register, so a third-party plugin's ``[table]`` parses from TOML
exactly as a built-in's does, and a table nobody registered stays an unknown option.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel, ConfigDict, Field

from outrelay import ConfigError, OutrelayConfig, hookimpl, load_config, parse_config
from outrelay.core.config.config import config_model
from outrelay.core.config.registry import Registry, get_registry, set_registry
from outrelay.plugins.crypto import CryptoConfig, crypto_config
from outrelay.plugins.eventlog import EventLogConfig, event_log_config
from outrelay.plugins.otel import TracingConfig, tracing_config


class GreetingConfig(BaseModel):
    """A third party's ``[greeting]`` table: every field has a default."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    text: str = "hello"
    times: int = Field(1, ge=1, le=10)


class AuditTrailConfig(BaseModel):
    """A third party's optional ``[trail]`` table (``to`` has no default) checked against the destinations."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    to: str

    def check_config(self, config: OutrelayConfig) -> None:
        if self.to not in config.destinations:
            raise ValueError(f"trail.to names destination {self.to!r}, which is not defined")


class _GreetingPlugin:
    @hookimpl
    def outrelay_config_sections(self) -> dict[str, type[BaseModel]]:
        return {"greeting": GreetingConfig, "trail": AuditTrailConfig}


def _registry(*plugins: object) -> Registry:
    reg = Registry(autoload=False).copy()
    for plugin in plugins:
        reg.pm.register(plugin)
    return reg


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "outrelay.toml"
    p.write_text(text)
    return p


@pytest.fixture
def own_process_registry() -> Iterator[None]:
    previous = set_registry(None)
    yield
    set_registry(previous)


def test_a_third_party_section_parses_from_toml(tmp_path: Path) -> None:
    """A plugin's section is validated by its model and read back typed; absent, it is its defaults or None."""
    reg = _registry(_GreetingPlugin())
    path = write(
        tmp_path,
        '[greeting]\ntext = "hi"\ntimes = 3\n[trail]\nto = "d"\n[destinations.d]\ntransport = "memory"\n',
    )
    cfg = load_config(path, registry=reg)
    assert cfg.section("greeting", GreetingConfig) == GreetingConfig(text="hi", times=3)
    assert cfg.section("trail", AuditTrailConfig) == AuditTrailConfig(to="d")
    bare = parse_config({}, registry=reg)
    assert bare.section("greeting", GreetingConfig) == GreetingConfig()
    assert bare.section("trail", AuditTrailConfig) is None
    # a config built without the plugin answers as a file without the table
    assert OutrelayConfig().section("greeting", GreetingConfig) == GreetingConfig()


def test_a_sections_errors_read_as_the_cores(tmp_path: Path) -> None:
    """Errors in a plugin's section name ``section.key``; its check_config runs against the whole file."""
    reg = _registry(_GreetingPlugin())
    with pytest.raises(ConfigError) as exc:
        load_config(write(tmp_path, "[greeting]\ntimes = 11\n"), registry=reg)
    assert str(exc.value) == f"{tmp_path / 'outrelay.toml'}: greeting.times: Input should be less than or equal to 10"
    with pytest.raises(ConfigError, match=r"greeting\.txt: unknown option"):
        parse_config({"greeting": {"txt": "x"}}, registry=reg)
    with pytest.raises(ConfigError, match=r"trail\.to names destination 'nope', which is not defined"):
        parse_config({"trail": {"to": "nope"}}, registry=reg)


def test_an_unknown_section_is_still_rejected(tmp_path: Path) -> None:
    """A table no plugin registers is an unknown option, with or without third-party plugins."""
    for reg in (Registry(autoload=False), _registry(_GreetingPlugin())):
        with pytest.raises(ConfigError) as exc:
            load_config(write(tmp_path, '[greetingz]\ntext = "x"\n'), registry=reg)
        assert str(exc.value) == f"{tmp_path / 'outrelay.toml'}: greetingz: unknown option (check the spelling)"
    with pytest.raises(ConfigError, match="greeting: unknown option"):
        parse_config({"greeting": {}}, registry=Registry(autoload=False))


def test_built_in_sections_belong_to_their_plugins() -> None:
    """[event_log], [tracing] and [crypto] are the plugins' models, read through their accessors."""
    assert set(OutrelayConfig.model_fields).isdisjoint({"event_log", "tracing", "crypto"})
    reg = Registry(autoload=False)
    assert {"event_log": EventLogConfig, "tracing": TracingConfig, "crypto": CryptoConfig}.items() <= (
        reg.config_sections().items()
    )
    cfg = parse_config(
        {
            "event_log": {"sample": 0.5},
            "crypto": {"keys": {"k": "env:K"}, "encrypt_with": "k"},
        },
        registry=reg,
    )
    assert event_log_config(cfg).sample == 0.5
    assert tracing_config(cfg) == TracingConfig()
    crypto = crypto_config(cfg)
    assert crypto is not None and crypto.encrypt_with == "k"
    assert crypto_config(OutrelayConfig()) is None and event_log_config(OutrelayConfig()).enabled
    with pytest.raises(TypeError, match="is a core table"):
        cfg.section("outbox", GreetingConfig)


def test_the_model_is_built_once_per_set_of_sections() -> None:
    """The same sections give the same class, named as the core's; more sections, another class."""
    base = Registry(autoload=False)
    model = config_model(base)
    assert model is config_model(base.copy()) and model.__name__ == "OutrelayConfig"
    assert issubclass(model, OutrelayConfig)
    more = config_model(_registry(_GreetingPlugin()))
    assert more is not model and "greeting" in more.model_fields


def test_conflicting_sections_are_an_error() -> None:
    """Two plugins registering one section, or a plugin registering a core table, is a ConfigError naming it."""

    class Other:
        @hookimpl
        def outrelay_config_sections(self) -> dict[str, type[BaseModel]]:
            return {"greeting": AuditTrailConfig}

    class Core:
        @hookimpl
        def outrelay_config_sections(self) -> dict[str, type[BaseModel]]:
            return {"outbox": GreetingConfig}

    with pytest.raises(ConfigError, match=r"config section \[greeting\] is registered twice \(.* and .*\)"):
        parse_config({}, registry=_registry(_GreetingPlugin(), Other()))
    with pytest.raises(ConfigError, match=r"registers config section \[outbox\], which is outrelay's own"):
        parse_config({}, registry=_registry(Core()))
    with pytest.raises(ConfigError, match="is registered twice"):
        parse_config({"tracing": {}}, registry=_registry(_Tracing()))


class _Tracing:
    @hookimpl
    def outrelay_config_sections(self) -> dict[str, type[BaseModel]]:
        return {"tracing": GreetingConfig}


@pytest.mark.usefixtures("own_process_registry")
def test_outrelay_plugins_module_adds_a_section(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module named by OUTRELAY_PLUGINS adds its section to the process's loader (no registry passed)."""
    (tmp_path / "or_test_section_plugin.py").write_text(
        "from pydantic import BaseModel, ConfigDict\n"
        "from outrelay import hookimpl\n\n"
        "class Shout(BaseModel):\n"
        "    model_config = ConfigDict(frozen=True, extra='forbid')\n"
        "    loud: bool = False\n\n"
        "@hookimpl\n"
        "def outrelay_config_sections():\n"
        "    return {'shout': Shout}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OUTRELAY_PLUGINS", "or_test_section_plugin")
    monkeypatch.setenv("OUTRELAY_DISABLE_PLUGIN_AUTOLOAD", "1")
    try:
        cfg = load_config(write(tmp_path, "[shout]\nloud = true\n"))
        shout = get_registry().config_sections()["shout"]
        section = cfg.section("shout", shout)
        assert section is not None and section.model_dump() == {"loud": True}
    finally:
        sys.modules.pop("or_test_section_plugin", None)
