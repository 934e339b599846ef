"""AWS peers for the SNS/SQS tests: moto in server mode and a throttling proxy.

``moto_endpoint`` (session fixture) starts ``moto_server -H 127.0.0.1 -p PORT``
on a free port, or uses ``OUTRELAY_AWS_ENDPOINT_URL`` when set (LocalStack, a
real AWS endpoint with real credentials in the environment). Tests create
uniquely named queues and topics, so one server serves the whole session.

:class:`ThrottlingProxy` is a loopback HTTP reverse proxy that answers the
first ``n`` matching requests with the service's own throttling error (SQS
speaks the AWS JSON protocol in this botocore, SNS the query protocol), so
tests see what boto3 sees from a throttled AWS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.services import free_port, need, wait_port

__all__ = ["ThrottlingProxy", "aws_client", "aws_options", "moto_endpoint", "unique"]

DUMMY = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def aws_options(endpoint: str) -> dict[str, Any]:
    """Transport options for the peer: endpoint plus dummy credentials (unless external)."""
    opts: dict[str, Any] = {"endpoint_url": endpoint, "region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    if not os.environ.get("OUTRELAY_AWS_ENDPOINT_URL"):
        opts.update(access_key_id="testing", secret_access_key="testing")
    return opts


def aws_client(service: str, endpoint: str) -> Any:
    import boto3

    kw: dict[str, Any] = dict(DUMMY) if not os.environ.get("OUTRELAY_AWS_ENDPOINT_URL") else {}
    kw.setdefault("region_name", os.environ.get("AWS_DEFAULT_REGION", "us-east-1"))
    return boto3.client(service, endpoint_url=endpoint, **kw)


def _moto_command(port: int) -> list[str] | None:
    """``python -m tests.peers.moto`` (moto's own server with the FIFO fix below)."""
    try:
        import moto.server  # noqa: F401
    except ImportError:
        found = shutil.which("moto_server")
        return [found, "-H", "127.0.0.1", "-p", str(port)] if found else None
    return [sys.executable, "-m", "tests.peers.moto", "-H", "127.0.0.1", "-p", str(port)]


def _speed_up_fifo_queues() -> bool:
    """Work around a moto 5.x performance bug, without changing behaviour.

    moto's SQS reads ``queue.attributes["ContentBasedDeduplication"]`` on
    every FIFO send, and its receive reads ``MessageRetentionPeriod`` through
    ``get_queue_attributes`` for every message returned; each such read
    recomputes the approximate message counts by scanning the queue three
    times, so n messages cost O(n²): minutes for the 5,000-event tests. The
    fix rewrites those reads to the stored fields the attributes are
    computed from (same values). moto's clock (two datetimes per reading,
    read twice per queued message on every receive) is replaced by
    ``time.time()`` inside the SQS models. Returns
    False (and changes nothing) when moto's source no longer matches.
    """
    import inspect
    import textwrap

    from moto.sqs import models

    flag = "str({}.content_based_deduplication).lower()"
    fixes = [
        ('self.attributes.get("ContentBasedDeduplication")', flag.format("self")),
        ('queue.attributes.get("ContentBasedDeduplication")', flag.format("queue")),
        (
            'self.get_queue_attributes(\n        queue_name, ["MessageRetentionPeriod"]\n    )["MessageRetentionPeriod"]',  # noqa: E501
            "self.get_queue(queue_name).message_retention_period",
        ),
    ]
    slow_unix_time = models.unix_time

    def unix_time(dt: Any = None) -> float:
        # The same wall-clock seconds as moto's datetime arithmetic, without building two datetimes per call.
        return time.time() if dt is None else float(slow_unix_time(dt))

    models.unix_time = unix_time
    models.unix_time_millis = lambda dt=None: unix_time(dt) * 1000.0
    patched = False
    for owner, name in (
        (models.Queue, "add_message"),
        (models.SQSBackend, "_validate_message"),
        (models.SQSBackend, "send_message"),
        (models.SQSBackend, "is_message_valid_based_on_retention_period"),
    ):
        src = textwrap.dedent(inspect.getsource(getattr(owner, name)))
        new = src
        for a, b in fixes:
            new = new.replace(a, b)
        if new == src:
            continue
        namespace: dict[str, Any] = {}
        exec(compile(new, models.__file__, "exec"), vars(models), namespace)  # moto's own source, two reads rewritten
        setattr(owner, name, namespace[name])
        patched = True
    return patched


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An AWS endpoint URL: external (``OUTRELAY_AWS_ENDPOINT_URL``) or a moto server of our own."""
    external = os.environ.get("OUTRELAY_AWS_ENDPOINT_URL")
    if external:
        yield external
        return
    port = free_port()
    cmd = _moto_command(port)
    if cmd is None:
        need(
            "moto server",
            "moto[server] is not installed; pip install 'moto[server]' or set OUTRELAY_AWS_ENDPOINT_URL",
        )
    log = (tmp_path_factory.mktemp("moto") / "moto.log").open("wb")
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    try:
        if not wait_port("127.0.0.1", port, timeout=30):
            need("moto server", f"moto_server did not listen on 127.0.0.1:{port} within 30 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _sqs_throttle() -> bytes:
    body = b'{"__type":"com.amazonaws.sqs#RequestThrottled","message":"Rate exceeded"}'
    head = (
        "HTTP/1.1 400 Bad Request\r\nContent-Type: application/x-amz-json-1.0\r\n"
        "x-amzn-query-error: RequestThrottled;Sender\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


def _sns_throttle() -> bytes:
    body = (
        b"<ErrorResponse><Error><Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message>"
        b"</Error><RequestId>00000000-0000-0000-0000-000000000000</RequestId></ErrorResponse>"
    )
    head = (
        "HTTP/1.1 400 Bad Request\r\nContent-Type: text/xml\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + body


class ThrottlingProxy:
    """Reverse proxy to ``upstream`` throttling the first ``n`` batch sends.

    Matches SQS ``SendMessageBatch`` (``X-Amz-Target`` header, JSON protocol)
    and SNS ``PublishBatch`` (``Action=PublishBatch`` form body, query
    protocol); every other request passes through. ``throttled`` counts what
    it refused. One response per connection (``Connection: close``).
    """

    def __init__(self, upstream: str, n: int) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.remaining = n
        self.throttled = 0
        self.passed = 0
        self.server: asyncio.Server | None = None
        self.url = ""

    async def __aenter__(self) -> ThrottlingProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            target = headers.get("x-amz-target", "")
            reply: bytes | None = None
            if self.remaining > 0:
                if target.endswith("SendMessageBatch"):
                    reply = _sqs_throttle()
                elif b"Action=PublishBatch" in body:
                    reply = _sns_throttle()
            if reply is not None:
                self.remaining -= 1
                self.throttled += 1
                writer.write(reply)
            else:
                self.passed += 1
                writer.write(await self._forward(lines, body))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _forward(self, lines: list[str], body: bytes) -> bytes:
        up_r, up_w = await asyncio.open_connection(*self.upstream)
        kept = [ln for ln in lines[1:] if ln and not ln.lower().startswith("connection:")]
        out = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1") + body
        up_w.write(out)
        await up_w.drain()
        data = await up_r.read()
        up_w.close()
        with contextlib.suppress(Exception):
            await up_w.wait_closed()
        return data


if __name__ == "__main__":  # the moto_endpoint fixture's server process
    from moto.server import main

    _speed_up_fifo_queues()
    main(sys.argv[1:])
