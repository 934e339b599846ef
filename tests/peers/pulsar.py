"""Pulsar peer for the tests: pulsar-lite, or an external broker.

``pulsar_url`` (session fixture) starts ``pulsar-lite --addr 127.0.0.1:PORT
--db-path DIR`` from the installed ``pulsar-lite`` wheel on a free port, or
uses ``OUTRELAY_PULSAR_URL`` when set (a real Pulsar, e.g.
``pulsar://127.0.0.1:6650``). pulsar-lite speaks the Pulsar binary protocol
but has no broker-side deduplication, so tests against it run the transport
with ``deduplication = false`` unless ``OUTRELAY_PULSAR_DEDUP=1`` says the
external namespace has it enabled.

pulsar-lite has no authentication or authorization: its Connect handler ignores
``auth_method_name``/``auth_data`` and any client may produce to any topic
(its SECURITY.md: "not intended to provide production-grade authentication,
authorization"). :func:`pulsar_token` gives the tests a token all the same — it
is sent and ignored — so the transport's token handling runs and can be checked
for leaks; nothing here can refuse a client.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.peers.conformance_hooks import long_secret
from tests.services import free_port, need, stop_process, wait_port

__all__ = ["PULSAR_LITE_NO_AUTH", "pulsar_binary", "pulsar_dedup", "pulsar_token", "pulsar_url"]

#: why no credentials can be refused on pulsar-lite (a skip reason)
PULSAR_LITE_NO_AUTH = (
    "pulsar-lite has no authentication or authorization: it ignores the token and lets every client produce to "
    "every topic, so no credentials can be refused"
)


def pulsar_binary() -> Path | None:
    """The pulsar-lite executable inside the installed wheel, if any."""
    try:
        import pulsar_lite
    except ImportError:
        return None
    path = Path(pulsar_lite.__file__).parent / "bin" / "pulsar-lite"
    return path if path.exists() else None


def pulsar_dedup() -> bool:
    """True when the broker under test deduplicates (external, declared by the user)."""
    return bool(os.environ.get("OUTRELAY_PULSAR_URL")) and os.environ.get("OUTRELAY_PULSAR_DEDUP", "") == "1"


def pulsar_token() -> str | None:
    """The token the tests configure: ``OUTRELAY_PULSAR_TOKEN`` for an external broker (``None`` without it);
    for pulsar-lite, which ignores authentication data, a new random one."""
    if os.environ.get("OUTRELAY_PULSAR_URL"):
        return os.environ.get("OUTRELAY_PULSAR_TOKEN") or None
    return long_secret("orpulsartoken")


@pytest.fixture(scope="session")
def pulsar_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Pulsar service URL: external (``OUTRELAY_PULSAR_URL``) or our own pulsar-lite."""
    external = os.environ.get("OUTRELAY_PULSAR_URL")
    if external:
        yield external
        return
    binary = pulsar_binary()
    if binary is None:
        need("pulsar-lite", "the pulsar-lite wheel is missing; pip install pulsar-lite or set OUTRELAY_PULSAR_URL")
    port = free_port()
    base = tmp_path_factory.mktemp("pulsar")
    log = (base / "pulsar-lite.log").open("wb")
    proc = subprocess.Popen(
        [str(binary), "--addr", f"127.0.0.1:{port}", "--db-path", str(base / "db"), "--log-level", "warn"],
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=base,
    )
    try:
        if not wait_port("127.0.0.1", port, timeout=30):
            need("pulsar-lite", f"pulsar-lite did not listen on 127.0.0.1:{port} within 30 s")
        yield f"pulsar://127.0.0.1:{port}"
    finally:
        stop_process(proc)
        log.close()
