"""Config loading and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from outrelay import ConfigError, load_config, parse_config


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "outrelay.toml"
    p.write_text(text)
    return p


class TestLoadConfig:
    def test_full_example(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """The README example parses, with ${VAR} interpolated and common options split from transport ones."""
        monkeypatch.setenv("HOOK_SECRET", "whsec_abc")
        cfg = load_config(
            write(
                tmp_path,
                """
[outbox]
url = "sqlite:///outbox.db"
[destinations.hooks]
transport = "webhook"
url = "https://example.com/hook"
secret = "${HOOK_SECRET}"
batch_size = 50
[destinations.hooks.retry]
max_attempts = 3
[[routes]]
types = ["workflow.*", "activity.failed"]
tenants = ["acme"]
destinations = ["hooks"]
on_exhausted = "park"
""",
            )
        )
        hooks = cfg.destinations["hooks"]
        assert hooks.options == {"url": "https://example.com/hook", "secret": "whsec_abc"}
        assert hooks.batch_size == 50 and hooks.retry.max_attempts == 3
        assert cfg.routes[0].on_exhausted == "park"

    def test_default_in_interpolation(self, tmp_path: Path) -> None:
        """${VAR:-default} falls back to the default when VAR is unset."""
        cfg = load_config(write(tmp_path, '[outbox]\nurl = "${OUTRELAY_TEST_UNSET_X:-sqlite:///d.db}"\n'))
        assert cfg.outbox.url == "sqlite:///d.db"

    @pytest.mark.parametrize(
        ("text", "needle"),
        [
            ('[outbox\nurl="x"', "invalid TOML"),
            ('[destinations.h]\ntransport = "webhook"\nsecret = "${OUTRELAY_TEST_UNSET_Y}"', "OUTRELAY_TEST_UNSET_Y"),
            ('[[routes]]\ndestinations = ["nowhere"]', "'nowhere', which is not defined"),
            ("[relay]\npoll_intervall = 1", "unknown option"),
            ('[destinations.h]\ntransport = "file"\n[destinations.h.retry]\nmax_attempts = 0', "max_attempts"),
            ("[[routes]]\ndestinations = []", "at least one destination"),
        ],
    )
    def test_errors_are_one_line_with_file(self, tmp_path: Path, text: str, needle: str) -> None:
        """Every config error is one line that names the file and the problem."""
        path = write(tmp_path, text)
        with pytest.raises(ConfigError) as info:
            load_config(path)
        msg = str(info.value)
        assert needle in msg and str(path) in msg and "\n" not in msg

    def test_missing_file(self, tmp_path: Path) -> None:
        """A missing config file says how to provide one."""
        with pytest.raises(ConfigError, match="--config"):
            load_config(tmp_path / "nope.toml")

    def test_frozen(self) -> None:
        """Config objects cannot be mutated."""
        cfg = parse_config({})
        with pytest.raises(Exception):  # noqa: B017 - pydantic's ValidationError
            cfg.relay.poll_interval = 3  # type: ignore[misc]
