"""Plugin discovery through the ``outrelay`` entry-point group."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from outrelay import ConfigError, MissingExtraError, Registry, UnknownTransportError, hookimpl
from outrelay.core.config.config import parse_config
from outrelay.core.config.registry import get_registry, set_registry
from outrelay.core.history.upcasting import Upcasters

PLUGIN = """
from collections.abc import Sequence
from outrelay import Delivered, Message, SendResult, Transport, TransportConfig, hookimpl


class EchoConfig(TransportConfig):
    greeting: str = "hi"


class EchoTransport(Transport):
    name = "echo"
    Config = EchoConfig

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        return [Delivered() for _ in batch]


@hookimpl
def outrelay_add_transports(registry):
    registry.add_transport("echo", EchoTransport)
    registry.add_transport("needs-lib", "nowhere:X", requires=("outrelay_no_such_lib",), extra="nolib")
"""


@pytest.fixture
def third_party(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A third-party distribution on sys.path, found only through its entry point."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "echo_plugin.py").write_text(textwrap.dedent(PLUGIN))
    dist = site / "outrelay_echo-1.2.3.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: outrelay-echo\nVersion: 1.2.3\n")
    (dist / "entry_points.txt").write_text("[outrelay]\necho = echo_plugin\n")
    monkeypatch.syspath_prepend(str(site))
    yield site
    sys.modules.pop("echo_plugin", None)


class TestRegistry:
    def test_builtins_registered(self) -> None:
        """Every first-party transport is registered."""
        names = set(Registry().transports)
        assert {
            "memory",
            "file",
            "webhook",
            "kafka",
            "nats",
            "rabbitmq",
            "redis",
            "sns",
            "sqs",
            "pubsub",
            "servicebus",
            "pulsar",
        } <= names

    def test_builtins_without_autoload(self) -> None:
        """OUTRELAY_DISABLE_PLUGIN_AUTOLOAD keeps the built-ins and drops third parties."""
        assert "memory" in Registry(autoload=False).transports

    def test_third_party_found_by_entry_point(self, third_party: Path) -> None:
        """A third-party transport is found through its entry point, with its distribution as origin."""
        reg = Registry()
        spec = reg.transport_spec("echo")
        assert spec.origin == "outrelay-echo 1.2.3"
        t = reg.create_transport("echo", {"greeting": "yo"}, destination="e")
        assert t.config.greeting == "yo"  # type: ignore[attr-defined]
        assert "echo" not in Registry(autoload=False).transports

    def test_invalid_options_one_line(self, third_party: Path) -> None:
        """Unknown transport options are a one-line ConfigError naming the destination."""
        with pytest.raises(ConfigError, match=r"destinations\.e: greting: unknown option"):
            Registry().create_transport("echo", {"greting": "x"}, destination="e")

    def test_missing_extra_names_pip_line(self, third_party: Path) -> None:
        """A transport whose client library is missing fails only when configured, with the pip line."""
        reg = Registry()
        with pytest.raises(MissingExtraError, match=r'pip install "outrelay\[nolib\]"'):
            reg.create_transport("needs-lib", {}, destination="x")

    def test_unknown_transport(self) -> None:
        """An unknown transport name lists the installed ones."""
        with pytest.raises(UnknownTransportError, match=r"installed transports: .*memory"):
            Registry().transport_spec("nope")

    def test_misspelt_hook_is_an_error(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """A plugin implementing a hook that does not exist fails loudly (check_pending)."""
        site = tmp_path / "s2"
        site.mkdir()
        (site / "typo_plugin.py").write_text(
            "from outrelay import hookimpl\n\n@hookimpl\ndef outrelay_add_transport(registry):\n    pass\n"
        )
        dist = site / "typo-0.1.dist-info"
        dist.mkdir()
        (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: typo\nVersion: 0.1\n")
        (dist / "entry_points.txt").write_text("[outrelay]\ntypo = typo_plugin\n")
        monkeypatch.syspath_prepend(str(site))
        try:
            with pytest.raises(Exception, match=r"outrelay_add_transport"):
                Registry()
        finally:
            sys.modules.pop("typo_plugin", None)


def test_outrelay_plugins_loads_named_modules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """OUTRELAY_PLUGINS registers the modules it names (without an entry point), even with autoload off;
    a module that fails to import is one ConfigError naming the variable and the module."""
    (tmp_path / "or_test_named_plugin.py").write_text(
        "from outrelay import hookimpl\n\n@hookimpl\ndef outrelay_add_upcasters(registry):\n"
        "    registry.register('x.y', '1', lambda d: d)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("OUTRELAY_PLUGINS", " or_test_named_plugin , ")
    registry = Registry(autoload=False)
    assert registry.pm.get_plugin("or_test_named_plugin") is not None
    assert Upcasters().load_plugins(registry).current == {"x.y": "2"}
    monkeypatch.setenv("OUTRELAY_PLUGINS", "or_test_no_such_module")
    with pytest.raises(ConfigError, match="OUTRELAY_PLUGINS names 'or_test_no_such_module', which failed to import"):
        Registry(autoload=False)


class _Recorder:
    """A plugin that records the hooks it sees."""

    def __init__(self) -> None:
        self.configs: list[object] = []

    @hookimpl
    def outrelay_bus_configured(self, config: object) -> None:
        self.configs.append(config)

    @hookimpl
    def outrelay_add_upcasters(self, registry: Upcasters) -> None:
        registry.register("rec.x", "1", lambda d: d)

    @hookimpl
    def outrelay_receive_transform(self, consumer: str) -> Callable[[str], str]:
        return str.upper


@pytest.fixture
def own_process_registry() -> Iterator[None]:
    """The test starts with no process registry built and puts the previous one back after."""
    previous = set_registry(None)
    yield
    set_registry(previous)


@pytest.mark.usefixtures("own_process_registry")
class TestProcessRegistry:
    def test_built_once(self) -> None:
        """get_registry builds the registry on first use and returns that same object after."""
        first = get_registry()
        assert "memory" in first.transports
        assert get_registry() is first

    def test_set_registry_replaces_and_resets(self) -> None:
        """set_registry installs a registry and returns the one it replaced; None has the next call build anew."""
        built = get_registry()
        mine = Registry(autoload=False)
        assert set_registry(mine) is built
        assert get_registry() is mine
        assert set_registry(None) is mine
        fresh = get_registry()
        assert fresh is not mine and fresh is not built

    def test_callers_without_a_registry_use_the_process_one(self) -> None:
        """The store opener, the bus, the upcasters and the subscriber runtime take the process's registry."""
        from outrelay.core.consumer.bus import EventBus
        from outrelay.core.consumer.subscriber import _receive_transforms
        from outrelay.core.stores.outbox import open_store

        mine = Registry(autoload=False)
        recorder = _Recorder()
        mine.pm.register(recorder)
        mine.add_store("orzz", "or_test_no_such_store_module:Store")
        with pytest.raises(ConfigError, match="unknown scheme 'orzz'"):
            open_store("orzz://x")
        set_registry(mine)
        with pytest.raises(ConfigError, match=r"the orzz outbox needs an extra .*or_test_no_such_store_module"):
            open_store("orzz://x")
        cfg = parse_config({})
        EventBus.from_config(cfg)
        assert recorder.configs == [cfg]
        assert Upcasters().load_plugins().current == {"rec.x": "2"}
        assert _receive_transforms("c") == [str.upper]

    def test_copy_shares_plugins_not_additions(self) -> None:
        """A copy has the registry's plugins and transports; what is added to either stays out of the other."""
        base = Registry(autoload=False)
        copy = base.copy()
        assert {n for n, _ in copy.pm.list_name_plugin()} == {n for n, _ in base.pm.list_name_plugin()}
        assert copy.transports == base.transports and copy.stores == base.stores
        recorder = _Recorder()
        copy.pm.register(recorder)
        copy.add_transport("or-copy-only", "nowhere:X")
        cfg = parse_config({})
        base.pm.hook.outrelay_bus_configured(config=cfg)
        assert recorder.configs == [] and "or-copy-only" not in base.transports
        copy.pm.hook.outrelay_bus_configured(config=cfg)
        assert recorder.configs == [cfg]
        base.add_store("or-base-only", "nowhere:Y")
        assert "or-base-only" not in copy.stores
        assert copy.create_transport("memory", {}, destination="m").destination == "m"
