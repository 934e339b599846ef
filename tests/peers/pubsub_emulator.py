"""The official Google Cloud Pub/Sub emulator for tests, and a throttling gRPC proxy.

``pubsub_emulator`` (session fixture) yields ``HOST:PORT`` of an emulator:
``OUTRELAY_PUBSUB_EMULATOR_HOST`` when set (an emulator the user runs), else
one started here from the ``google-cloud-cli-pubsub-emulator`` package on a
free port (ready when it logs "Server started"), killed at the end of the
session. Without the package the tests skip through :func:`tests.services.need`.

:class:`ThrottlingProxy` sits between a publisher and the emulator and
answers every n-th ``Publish`` RPC with gRPC ``RESOURCE_EXHAUSTED`` (what
Pub/Sub returns when a quota is exceeded); the emulator itself cannot be
made to throttle.

The emulator authenticates no one and checks no permission: it logs "IAM
integration is disabled. IAM policy methods and ACL checks are not supported"
unless started with the undocumented ``--enable_iam_integration``, which hands
every check to a separate "IAM emulator" (``--iam_host``/``--iam_port``, an
internal ``IamInternal`` gRPC API) that Google does not ship. And the transport
sends no credentials to an ``emulator_host`` (an insecure channel, anonymous):
``credentials_file`` applies to the real service only. :data:`NO_AUTH` says so
for the credential checks of the conformance suite.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from tests.services import free_port, need, port_open

__all__ = ["NO_AUTH", "PROJECT", "ThrottlingProxy", "create_topic", "pubsub_emulator"]

PROJECT = "test-project"
#: why the conformance suite's credential checks cannot run against the emulator (check name -> skip reason)
NO_AUTH = {
    "secret_never_leaks": "no secret to configure: with emulator_host the transport connects to the Pub/Sub emulator "
    "anonymously over plaintext gRPC (credentials_file applies to the real service only)",
    **dict.fromkeys(
        ("forbidden_send_permanent", "forbidden_check_says_what"),
        "the Pub/Sub emulator checks no permissions (IAM integration is off; turning it on needs Google's IAM "
        "emulator, which is not distributed), so no caller can be refused",
    ),
}
_CANDIDATES = (
    "/usr/lib/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator",
    "/usr/share/google-cloud-sdk/platform/pubsub-emulator/bin/cloud-pubsub-emulator",
)
_lock = threading.Lock()
_started: dict[str, Any] = {}


def emulator_binary() -> str | None:
    for path in _CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("cloud-pubsub-emulator")


def _start() -> str:
    binary = emulator_binary()
    if binary is None:
        need(
            "Pub/Sub emulator",
            "cloud-pubsub-emulator is not installed (apt-get install google-cloud-cli-pubsub-emulator openjdk-17-jre,"
            " or set OUTRELAY_PUBSUB_EMULATOR_HOST=HOST:PORT)",
        )
    port = free_port()
    data_dir = tempfile.mkdtemp(prefix="outrelay-pubsub-")
    log_path = Path(data_dir) / "emulator.log"
    log = open(log_path, "wb")  # noqa: SIM115 - closed in _stop
    proc = subprocess.Popen(
        [binary, "--host=127.0.0.1", f"--port={port}"],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the launcher starts java: stop the whole group
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if b"Server started" in log_path.read_bytes() and port_open("127.0.0.1", port):
            break
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    else:
        proc.poll()
    if proc.returncode is not None or not port_open("127.0.0.1", port):
        _stop_proc(proc)
        log.close()
        need("Pub/Sub emulator", f"it did not start: {log_path.read_text(errors='replace')[-500:]}")
    _started.update(proc=proc, log=log)
    return f"127.0.0.1:{port}"


def _stop_proc(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


@pytest.fixture(scope="session")
def pubsub_emulator() -> Iterator[str]:
    """``HOST:PORT`` of a Pub/Sub emulator (see the module docstring)."""
    external = os.environ.get("OUTRELAY_PUBSUB_EMULATOR_HOST")
    if external:
        host, _, port = external.rpartition(":")
        if not port_open(host, int(port)):
            need("Pub/Sub emulator", f"OUTRELAY_PUBSUB_EMULATOR_HOST={external} does not answer")
        yield external
        return
    with _lock:
        host = _started.get("host") or _start()
        _started["host"] = host
    yield host
    with _lock:
        proc = _started.pop("proc", None)
        if proc is not None:
            _stop_proc(proc)
            _started.pop("log").close()
        _started.pop("host", None)


def create_topic(host: str, topic: str, *, subscription: str | None = None, ordering: bool = True) -> str:
    """Create ``topic`` (and optionally a pull ``subscription``) on the emulator; returns the topic path."""
    from outrelay.transports.pubsub._client import make_publisher, make_subscriber
    from outrelay.transports.pubsub._config import PubSubConfig

    cfg = PubSubConfig(project=PROJECT, emulator_host=host)
    pub = make_publisher(cfg)
    try:
        pub.create_topic(name=cfg.topic_path(topic), timeout=10)
    finally:
        pub.stop()
        pub.transport.close()
    if subscription is not None:
        sub = make_subscriber(cfg)
        try:
            sub.create_subscription(
                request={
                    "name": cfg.subscription_path(subscription),
                    "topic": cfg.topic_path(topic),
                    "enable_message_ordering": ordering,
                },
                timeout=10,
            )
        finally:
            sub.close()
    return cfg.topic_path(topic)


class ThrottlingProxy:
    """A gRPC pass-through to ``upstream`` that throttles some Publish RPCs.

    ``throttle(every=n, count=k)``: answer every n-th Publish with
    RESOURCE_EXHAUSTED, k times in all. Other RPCs pass untouched.
    """

    PUBLISH = "/google.pubsub.v1.Publisher/Publish"

    def __init__(self, upstream: str) -> None:
        import grpc

        self.upstream = grpc.insecure_channel(upstream)
        self.port = free_port()
        self.calls = 0
        self.every = 0
        self.left = 0
        self.throttled = 0
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.server.add_generic_rpc_handlers((_Forward(self),))
        self.server.add_insecure_port(f"127.0.0.1:{self.port}")

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> ThrottlingProxy:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(grace=None).wait(5)
        self.upstream.close()

    def throttle(self, *, every: int, count: int) -> None:
        with self._lock:
            self.every, self.left, self.calls = every, count, 0

    def _should_throttle(self, method: str) -> bool:
        if method != self.PUBLISH:
            return False
        with self._lock:
            self.calls += 1
            if self.left > 0 and self.every and self.calls % self.every == 0:
                self.left -= 1
                self.throttled += 1
                return True
        return False


class _Forward:
    """Generic handler: raw request bytes in, raw response bytes out."""

    def __init__(self, proxy: ThrottlingProxy) -> None:
        self.proxy = proxy

    def service(self, details: Any) -> Any:
        import grpc

        method = details.method
        proxy = self.proxy

        def unary(request: bytes, context: Any) -> bytes:
            if proxy._should_throttle(method):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "quota exceeded (throttling proxy)")
            call = proxy.upstream.unary_unary(method)
            try:
                return call(request, timeout=30)  # type: ignore[no-any-return]
            except grpc.RpcError as exc:
                context.abort(exc.code(), exc.details() or "")
                raise

        return grpc.unary_unary_rpc_method_handler(unary)
