"""Network addresses in the config: ports checked before anything connects.

A URL's port, or a ``host:port`` in a list of servers, that no socket can use
(``70000``, ``abc``) is a config error found when the config is validated
(``outrelay check --offline``, ``check`` and ``run`` alike), instead of a
client library's ``ValueError`` at the first connect, retried as an outage.

:func:`endpoint_problem` looks at one value; :func:`check_options` at every
option of a destination: strings that are URLs (``scheme://…``, several hosts
separated by commas allowed, as PostgreSQL and NATS write them), ``host:port``
lists under an option whose name says it holds servers (``bootstrap_servers``,
``servers``, ``hosts``, ``endpoint`` …), and whole numbers under an option
named ``port``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from outrelay.core.model.errors import ConfigError

__all__ = ["check_options", "endpoint_problem"]

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*://")
_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):([^:/\s,]*)$")
#: option names whose values are server addresses, so ``host:port`` strings there are checked
_SERVER_KEYS = re.compile(r"(server|bootstrap|broker|host|endpoint|address|url|seed)", re.I)


def endpoint_problem(value: str, *, hostport: bool = False) -> str | None:
    """Why ``value`` (a URL, or with ``hostport`` also ``host:port[,host:port…]``) names a port no
    socket can use, or None. A value with a ``{placeholder}`` or ``${VAR}`` left in it is not checked."""
    if "{" in value:
        return None
    if _SCHEME.match(value):
        netloc = re.split(r"[/?#]", value.split("://", 1)[1], maxsplit=1)[0]
        hosts = netloc.rpartition("@")[2]
    elif hostport and _HOSTPORT.match(value.split(",")[0].strip()):
        hosts = value
    else:
        return None
    for host in hosts.split(","):
        problem = _port_problem(host.strip())
        if problem:
            return problem
    return None


def _port_problem(host: str) -> str | None:
    m = _HOSTPORT.match(host)
    if m is None:
        return None  # no port (or not host:port at all): the client's default applies
    port = m.group(2)
    if not port.isdigit():
        return f"port {port!r} of {host!r} is not a number"
    if not 1 <= int(port) <= 65535:
        return f"port {int(port)} of {host!r} is out of range (1-65535)"
    return None


def check_options(options: Mapping[str, Any], *, where: str) -> None:
    """Check every address in a destination's ``options`` (see the module docstring).

    :raises ConfigError: naming ``where`` (e.g. ``destinations.hooks``), the option and the port.
    """
    for key, value in _walk(options):
        last = key.rsplit(".", 1)[-1].split("[", 1)[0]
        problem: str | None = None
        if isinstance(value, str):
            problem = endpoint_problem(value, hostport=bool(_SERVER_KEYS.search(last)))
        elif isinstance(value, int) and not isinstance(value, bool) and last.endswith("port"):
            problem = None if 1 <= value <= 65535 else f"port {value} is out of range (1-65535)"
        if problem:
            raise ConfigError(f"{key}: {problem}", where=where)


def _walk(value: Any, key: str = "") -> Iterator[tuple[str, Any]]:
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from _walk(v, f"{key}.{k}" if key else str(k))
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from _walk(v, f"{key}[{i}]")
    else:
        yield key, value
