"""Shared CLI plumbing: config loading, secret masking, one-line errors."""

from __future__ import annotations

import logging
import re
import sys
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from outrelay.core.config.config import OutrelayConfig, default_config_path, load_config
from outrelay.core.model.errors import ConfigError

__all__ = [
    "CLIENT_LOGGERS",
    "ConfigOption",
    "config_context",
    "console",
    "err_console",
    "error_line",
    "load",
    "mask",
    "quiet_stdout",
    "require_destinations",
    "secrets_of",
    "setup_logging",
]

console = Console(highlight=False, soft_wrap=True)
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

ConfigOption = typer.Option(
    None,
    "--config",
    "-c",
    help="Config file (default: $OUTRELAY_CONFIG or ./outrelay.toml).",
    show_default=False,
)


def command_group(help: str) -> typer.Typer:
    """A group of subcommands (``outrelay dlq``, ``outrelay audit``, ...): ``help`` is its
    description; called without a subcommand it prints its help; no completion commands of its own."""
    return typer.Typer(help=help, no_args_is_help=True, add_completion=False)


_SECRET_KEYS = re.compile(r"(secret|password|passwd|token|key|credential|connection_string|sasl)", re.I)
_URL_USERINFO = re.compile(r"(?P<scheme>[a-z][a-z0-9+.\-]*://)(?P<user>[^:/@\s]*):(?P<pw>[^@/\s]+)@", re.I)
_KV_SECRET = re.compile(r"(?i)\b(SharedAccessKey|password|token|secret|AccountKey)=([^;&\s]+)")


def load(path: Path | None) -> OutrelayConfig:
    """Load the config file (ConfigError propagates to the one-line handler)."""
    return load_config(path if path is not None else default_config_path())


def require_destinations(cfg: OutrelayConfig) -> None:
    """`run` and `check` refuse a config without destinations alike, before creating anything.

    :raises ConfigError: no ``[destinations.NAME]`` table.
    """
    if not cfg.destinations:
        raise ConfigError("no destinations configured; add a [destinations.NAME] table")


@contextmanager
def config_context(path: Path | None) -> Iterator[None]:
    """Prefix ConfigErrors raised while building from the config with its path."""
    try:
        yield
    except ConfigError as exc:
        where = str(path if path is not None else default_config_path())
        if str(exc).startswith(where):
            raise
        raise type(exc)(str(exc), where=where) from None


def secrets_of(config: OutrelayConfig) -> list[str]:
    """Every value under a secret-looking key of any destination (for masking)."""
    found: list[str] = []

    def walk(value: Any, key: str = "") -> None:
        if isinstance(value, Mapping):
            for k, v in value.items():
                walk(v, str(k))
        elif isinstance(value, list | tuple):
            for v in value:
                walk(v, key)
        elif isinstance(value, str) and value and _SECRET_KEYS.search(key) and len(value) >= 4:
            found.append(value)

    for dest in config.destinations.values():
        walk(dest.options)
    walk({"url": config.outbox.url})
    return found


def mask(text: str | None, secrets: Iterable[str] = ()) -> str | None:
    """Hide known secret values, URL passwords and key=value secrets."""
    if text is None:
        return None
    for s in sorted(set(secrets), key=len, reverse=True):
        text = text.replace(s, "***")
    text = _URL_USERINFO.sub(lambda m: f"{m['scheme']}{m['user']}:***@", text)
    return _KV_SECRET.sub(lambda m: f"{m.group(1)}=***", text)


#: set by :func:`setup_logging`: errors that end the process are then printed as JSON log lines too
JSON_LOGS = False


#: client libraries that log every reconnect attempt (aiokafka and aiormq at ERROR) what the relay
#: reports itself, once per outage: their records are shown only with --log-level debug, as DEBUG
CLIENT_LOGGERS = frozenset(
    (
        "aiokafka", "kafka", "aiormq", "aio_pika", "pamqp", "nats", "redis", "pulsar", "azure", "uamqp",
        "proton", "google", "grpc", "botocore", "boto3", "s3transfer", "urllib3", "httpx", "httpcore",
        "psycopg", "psycopg_pool", "paho", "aiohttp",
    )
)  # fmt: skip


class _FoldClientLogs(logging.Filter):
    """Drops client libraries' records (see :data:`CLIENT_LOGGERS`), or with ``show`` re-levels them DEBUG."""

    def __init__(self, show: bool) -> None:
        super().__init__()
        self.show = show

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name.partition(".")[0] not in CLIENT_LOGGERS:
            return True
        if not self.show:
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


def setup_logging(level: str, fmt: str) -> None:
    """Text or JSON-lines logs on stderr. Client libraries' warnings (and Python warnings)
    go through the same formatter, so in JSON mode every line on stderr is JSON. What client
    libraries log (see :data:`CLIENT_LOGGERS`) is folded into the relay's own one warning per
    outage: shown only with ``--log-level debug``, at DEBUG."""
    global JSON_LOGS
    handler = logging.StreamHandler(sys.stderr)
    formatter: logging.Formatter
    if fmt == "json":
        from outrelay.cli._jsonlog import JsonFormatter

        formatter = JsonFormatter()
    else:
        from outrelay.cli._jsonlog import TextFormatter

        formatter = TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    JSON_LOGS = fmt == "json"
    handler.setFormatter(formatter)
    root = logging.getLogger("outrelay")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
    # everything else (aiokafka, httpx, ...) at WARNING and up: else Python's last-resort handler prints plain text
    other = logging.StreamHandler(sys.stderr)
    other.setFormatter(formatter)
    other.setLevel(logging.WARNING)
    other.addFilter(_FoldClientLogs(show=level.lower() == "debug"))
    logging.getLogger().handlers[:] = [other]
    logging.captureWarnings(True)


def error_line(message: str) -> str:
    """The one line an error that ends the process prints: JSON when the logs are JSON."""
    if JSON_LOGS:
        from outrelay.cli._jsonlog import error_json

        return error_json(message)
    return f"outrelay: error: {message}"


def quiet_stdout() -> None:
    """After a broken pipe on stdout (``outrelay ... | head``): point stdout at /dev/null, so the
    interpreter's final flush does not report the pipe the reader closed on purpose."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
