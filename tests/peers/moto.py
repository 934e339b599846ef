"""AWS peers for the SNS/SQS tests: moto in server mode and a throttling proxy.

``moto_endpoint`` (session fixture) starts ``moto_server -H 127.0.0.1 -p PORT``
on a free port, or uses ``OUTRELAY_AWS_ENDPOINT_URL`` when set (LocalStack, a
real AWS endpoint with real credentials in the environment). Tests create
uniquely named queues and topics, so one server serves the whole session.

``moto_iam`` (session fixture) starts a second, private moto server that
enforces IAM (:class:`IAMMoto`): the shared one accepts any credentials, and
moto's switch is process-wide. The conformance suites of both transports use
it for ``make_forbidden``; :func:`skip_why` says why the checks the AWS
targets cannot serve skip.

:class:`ThrottlingProxy` is a loopback HTTP reverse proxy that answers the
first ``n`` matching requests with the service's own throttling error (SQS
speaks the AWS JSON protocol in this botocore, SNS the query protocol), so
tests see what boto3 sees from a throttled AWS.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
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

from tests.peers.conformance_hooks import long_secret
from tests.services import free_port, need, stop_process, wait_port

__all__ = [
    "IAMMoto",
    "ThrottlingProxy",
    "aws_client",
    "aws_options",
    "moto_endpoint",
    "moto_iam",
    "require_iam",
    "skip_why",
    "suite_secret",
    "unique",
    "user_options",
]

DUMMY = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def aws_options(endpoint: str, *, secret: str = "testing") -> dict[str, Any]:
    """Transport options for the peer: endpoint plus dummy credentials (unless external).

    ``secret`` is the secret access key to configure: the shared moto server checks no signature, so
    any string works there (the conformance suites pass the one they grep for).
    """
    opts: dict[str, Any] = {"endpoint_url": endpoint, "region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1")}
    if not os.environ.get("OUTRELAY_AWS_ENDPOINT_URL"):
        opts.update(access_key_id="testing", secret_access_key=secret)
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


class PeerUnavailable(Exception):
    """A moto server of our own could not be started (the message says why)."""


@contextlib.contextmanager
def _moto_server(log_dir: Path) -> Iterator[str]:
    """A moto server on a free 127.0.0.1 port (``http://...``), killed on exit; ready within 30 s or
    :class:`PeerUnavailable`. Its output goes to ``log_dir/moto.log``."""
    port = free_port()
    cmd = _moto_command(port)
    if cmd is None:
        raise PeerUnavailable(
            "moto[server] is not installed; pip install 'moto[server]' or set OUTRELAY_AWS_ENDPOINT_URL"
        )
    with (log_dir / "moto.log").open("wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=Path(__file__).resolve().parents[2])
        try:
            if not wait_port("127.0.0.1", port, timeout=30):
                raise PeerUnavailable(f"moto_server did not listen on 127.0.0.1:{port} within 30 s")
            yield f"http://127.0.0.1:{port}"
        finally:
            stop_process(proc)


@pytest.fixture(scope="session")
def moto_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """An AWS endpoint URL: external (``OUTRELAY_AWS_ENDPOINT_URL``) or a moto server of our own."""
    external = os.environ.get("OUTRELAY_AWS_ENDPOINT_URL")
    if external:
        yield external
        return
    try:
        with _moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
            yield endpoint
    except PeerUnavailable as exc:
        need("moto server", str(exc))


@dataclasses.dataclass(frozen=True)
class IAMMoto:
    """A private moto server that authenticates and authorizes every request against its IAM.

    Made while it still let requests through: ``allowed`` (access key id, secret) of a user allowed
    ``sns:*`` and ``sqs:*``, ``denied`` of one allowed only to read (``sns:Get*``/``List*``,
    ``sqs:Get*``/``List*``) — it sees the topic and queue but may not publish — and a FIFO topic
    (``topic_arn``) and FIFO queue (``queue_url``). Secrets are moto's own (40 random characters).
    Unlike AWS, moto asks for ``sns:PublishBatch``/``sqs:SendMessageBatch`` rather than
    ``sns:Publish``/``sqs:SendMessage``; neither user's policy depends on the difference.
    """

    endpoint: str
    allowed: tuple[str, str] = dataclasses.field(repr=False)
    denied: tuple[str, str] = dataclasses.field(repr=False)
    topic_arn: str
    queue_url: str


def _iam_setup(endpoint: str) -> IAMMoto:
    """Make :class:`IAMMoto`'s users, topic and queue, then switch enforcement on and see that it holds.

    Enforcement is moto's ``/moto-api/reset-auth`` (what its ``set_initial_no_auth_action_count``
    decorator posts in server mode): ``0`` unauthenticated requests left, so every later request is
    signed-checked and authorized; it is process-wide, hence a server of its own.
    """
    import urllib.request

    import boto3
    import botocore.config
    import botocore.exceptions

    cfg = botocore.config.Config(connect_timeout=5, read_timeout=10, retries={"total_max_attempts": 1})

    def client(service: str, key: str = "testing", secret: str = "testing") -> Any:
        return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id=key,
                            aws_secret_access_key=secret, config=cfg)  # fmt: skip

    iam, sns, sqs = client("iam"), client("sns"), client("sqs")
    try:
        keys: dict[str, tuple[str, str]] = {}
        for user, actions in (
            ("outrelay-allowed", ["sns:*", "sqs:*"]),
            ("outrelay-denied", ["sns:Get*", "sns:List*", "sqs:Get*", "sqs:List*"]),
        ):
            iam.create_user(UserName=user)
            policy = {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": actions, "Resource": "*"}]}
            iam.put_user_policy(UserName=user, PolicyName="outrelay-tests", PolicyDocument=json.dumps(policy))
            made = iam.create_access_key(UserName=user)["AccessKey"]
            keys[user] = (str(made["AccessKeyId"]), str(made["SecretAccessKey"]))
        topic = str(sns.create_topic(Name="outrelay-forbidden.fifo", Attributes={"FifoTopic": "true"})["TopicArn"])
        queue = str(sqs.create_queue(QueueName="outrelay-forbidden.fifo", Attributes={"FifoQueue": "true"})["QueueUrl"])
        switch = urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth", data=b"0", method="POST", headers={"Content-Type": "text/plain"}
        )
        with urllib.request.urlopen(switch, timeout=10) as answer:
            answer.read()
        try:
            sqs.get_queue_attributes(QueueUrl=queue, AttributeNames=["QueueArn"])
        except botocore.exceptions.ClientError:
            pass  # unknown access key "testing": enforcement is on
        else:
            raise PeerUnavailable("moto still accepts unknown credentials after /moto-api/reset-auth 0")
    except (botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, OSError) as exc:
        raise PeerUnavailable(f"setting up IAM on the private moto server failed: {exc}") from exc
    finally:
        for c in (iam, sns, sqs):
            c.close()
    return IAMMoto(endpoint, keys["outrelay-allowed"], keys["outrelay-denied"], topic, queue)


EXTERNAL = (
    "OUTRELAY_AWS_ENDPOINT_URL is set: the credentials come from the environment, so the suite neither "
    "knows their secret nor can make a user without permission there"
)


@pytest.fixture(scope="session")
def moto_iam(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IAMMoto | str]:
    """A private IAM-enforcing moto server (:class:`IAMMoto`), or why there is none: a string, so that a
    conformance target can leave out the hooks needing it (:func:`skip_why` then skips those checks)
    instead of the whole suite skipping. Started once per session, on first use (~1-2 s)."""
    if os.environ.get("OUTRELAY_AWS_ENDPOINT_URL"):
        yield EXTERNAL
        return
    try:
        with _moto_server(tmp_path_factory.mktemp("moto-iam")) as endpoint:
            yield _iam_setup(endpoint)
    except PeerUnavailable as exc:
        yield str(exc)


#: checks of the conformance suite the AWS targets declare no hook for, and why AWS or moto cannot serve them
AWS_CANNOT = {
    "test_refused_target_mixed": (
        "SNS/SQS have no per-message refusal of a target to test: the one they have, a missing topic/queue, "
        "is retryable by design (an operator creates it; test_missing_*_is_retryable)"
    ),
    "test_throttle_retry_after": (
        "AWS throttling errors (SNS Throttling, SQS RequestThrottled) carry no retry hint to pass on; "
        "throttling itself is covered by test_throttling_is_retry_later"
    ),
}
_FORBIDDEN = ("test_forbidden_send_permanent", "test_forbidden_check_says_what")


def suite_secret(iam: IAMMoto | str) -> str | None:
    """The secret access key every transport of an AWS conformance target is configured with: the denied
    user's (so the forbidden transport carries the same one; the shared moto checks no signature), a
    random one without an IAM server, ``None`` against an external endpoint (the environment's)."""
    if isinstance(iam, IAMMoto):
        return iam.denied[1]
    return None if iam == EXTERNAL else long_secret()


def user_options(iam: IAMMoto, user: tuple[str, str]) -> dict[str, Any]:
    """Transport options reaching the IAM-enforcing server as ``user`` (access key id, secret), with short
    timeouts (the server is local)."""
    key, secret = user
    return {
        "endpoint_url": iam.endpoint,
        "region": "us-east-1",
        "access_key_id": key,
        "secret_access_key": secret,
        "connect_timeout": 1,
        "read_timeout": 3,
    }


def require_iam(iam: IAMMoto | str) -> IAMMoto:
    """``iam`` when there is an IAM server; else skip (external endpoint) or :func:`~tests.services.need` it."""
    if isinstance(iam, IAMMoto):
        return iam
    if iam == EXTERNAL:
        pytest.skip(EXTERNAL)
    need("moto IAM server", iam)


def skip_why(request: pytest.FixtureRequest, iam: IAMMoto | str) -> None:
    """From an autouse fixture of an AWS conformance suite: skip the checks its target cannot serve, with
    the reason (:data:`AWS_CANNOT`; the credential checks when ``iam`` says why there is no IAM server).

    A private server that failed is a missing service (:func:`~tests.services.need`: a failure under
    ``OUTRELAY_REQUIRE_SERVICES=1``); an external endpoint and the limits of AWS are plain skips.
    """
    name = getattr(request.node, "originalname", request.node.name)
    if name in AWS_CANNOT:
        pytest.skip(AWS_CANNOT[name])
    if iam == EXTERNAL and name in (*_FORBIDDEN, "test_secret_never_leaks"):
        pytest.skip(EXTERNAL)
    if isinstance(iam, str) and name in _FORBIDDEN:
        need("moto IAM server", iam)


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
