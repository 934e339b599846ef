"""Where the tests find an MQTT 5 broker.

``OUTRELAY_MQTT_HOST``/``OUTRELAY_MQTT_PORT`` name one (default
127.0.0.1:1883, the machine's Mosquitto). Without a broker (or without
``pip install -e examples/outrelay-mqtt``) the tests skip with the reason;
with ``OUTRELAY_REQUIRE_SERVICES=1`` (CI) they fail instead.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest


def require_services() -> bool:
    return os.environ.get("OUTRELAY_REQUIRE_SERVICES", "") not in ("", "0", "false", "no")


if require_services():  # CI installs the plugin (.ci/run); there a missing install fails instead of skipping
    import outrelay_mqtt  # noqa: F401


def need(what: str, why: str) -> NoReturn:
    """Skip (or, under OUTRELAY_REQUIRE_SERVICES=1, fail) because ``what`` is unavailable."""
    msg = f"{what} unavailable: {why}"
    if require_services():
        pytest.fail(msg + " (OUTRELAY_REQUIRE_SERVICES=1 turns this skip into a failure)", pytrace=False)
    pytest.skip(msg)


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def mqtt_broker() -> tuple[str, int]:
    """(host, port) of the shared MQTT 5 broker."""
    host = os.environ.get("OUTRELAY_MQTT_HOST", "127.0.0.1")
    port = int(os.environ.get("OUTRELAY_MQTT_PORT", "1883"))
    if not port_open(host, port):
        need("MQTT broker", f"nothing listens on {host}:{port} (start: mosquitto -d -c /etc/mosquitto/mosquitto.conf)")
    return host, port


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def own_mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """A Mosquitto of this module's own: ``(open_port, closed_port)``.

    On ``open_port`` anonymous clients may publish to ``open/#`` only, payloads over
    1,000 bytes are refused, packets over 4,000 bytes too (announced in CONNACK), and
    at most 2 QoS 1 messages may await their PUBACK (Receive Maximum 2).
    ``closed_port`` refuses anonymous clients.
    """
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(exe).exists():
        need("mosquitto", "the mosquitto binary is not installed (apt-get install mosquitto)")
    tmp = tmp_path_factory.mktemp("mosquitto")
    port, closed = free_port(), free_port()
    (tmp / "acl").write_text("topic readwrite open/#\n")
    (tmp / "mosquitto.conf").write_text(
        f"user {getpass.getuser()}\n"  # run as root, mosquitto would switch to a user who cannot read tmp_path
        "per_listener_settings true\npersistence false\nmessage_size_limit 1000\nmax_packet_size 4000\n"
        "max_inflight_messages 2\n"
        f"listener {port} 127.0.0.1\nallow_anonymous true\nacl_file {tmp / 'acl'}\n"
        f"listener {closed} 127.0.0.1\nallow_anonymous false\n"
    )
    proc = subprocess.Popen([exe, "-c", str(tmp / "mosquitto.conf")], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 10
        while not (port_open("127.0.0.1", port) and port_open("127.0.0.1", closed)):
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode()[-300:] if proc.stderr and proc.poll() is not None else ""
                need("mosquitto", f"it did not start on ports {port}/{closed}: {err}")
            time.sleep(0.05)
        yield port, closed
    finally:
        proc.terminate()
        proc.wait(10)
        if proc.stderr:
            proc.stderr.close()
