"""Helpers for tests that need real services (see docs/testing.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from typing import NoReturn

import pytest

__all__ = ["free_port", "need", "port_open", "require_services", "stop_process", "wait_port"]


def require_services() -> bool:
    """True when CI demands every service test run (``OUTRELAY_REQUIRE_SERVICES=1``)."""
    return os.environ.get("OUTRELAY_REQUIRE_SERVICES", "") not in ("", "0", "false", "no")


def need(what: str, why: str) -> NoReturn:
    """Skip (or, under OUTRELAY_REQUIRE_SERVICES=1, fail) because ``what`` is unavailable."""
    msg = f"{what} unavailable: {why}"
    if require_services():
        pytest.fail(msg + " (OUTRELAY_REQUIRE_SERVICES=1 turns this skip into a failure)", pytrace=False)
    pytest.skip(msg)


def port_open(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if port_open(host, port, 0.2):
            return True
        time.sleep(0.05)
    return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen[bytes], grace: float = 10.0) -> None:
    """Terminate ``proc``; kill it if it has not exited within ``grace`` seconds. Returns once it is gone."""
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
