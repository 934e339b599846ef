"""Shared AWS plumbing for the ``sns`` and ``sqs`` transports (boto3).

* :class:`AWSConfig` — credentials and region come from the standard AWS
  chain (environment, profile, instance role) unless given explicitly;
  ``endpoint_url`` points at an emulator (moto, LocalStack). Secrets are
  :class:`~pydantic.SecretStr` and never printed.
* :class:`AWSBase` — boto3 is blocking, so every call runs in a bounded
  :class:`~concurrent.futures.ThreadPoolExecutor` owned by the transport
  (``max_workers`` threads = at most that many API calls in flight); the one
  boto3 client is thread-safe and reused. The relay's event loop never blocks.
* :func:`map_aws_errors` — the one boundary where botocore exceptions become
  outrelay errors: throttling, 5xx, timeouts and connection failures are
  :class:`~outrelay.RetryableError`; a request the service refuses as
  invalid (``InvalidParameter``, too long, ...) is
  :class:`~outrelay.PermanentError`. A missing queue/topic or KMS key is
  retryable (the message is fine; an operator must create the destination),
  so events wait, then dead-letter after the retry policy is exhausted.
  Credentials the service does not accept (``InvalidClientTokenId``,
  ``SignatureDoesNotMatch``...) or that may not do the call
  (``AccessDenied``, SNS ``AuthorizationError``, ``KmsAccessDenied``, any
  HTTP 403) raise :class:`DeniedError`, a :class:`~outrelay.PermanentError`
  whose message says what to fix: never retried for ever (the conformance
  contract for credentials without permission). In ``send()`` results it is
  ``Rejected(disable_destination=True)``: the relay disables the destination
  and keeps its events pending — no event is dead-lettered because a policy
  changed — until an operator fixes the credentials and runs
  ``outrelay enable NAME``. ``open()`` raises it (the relay keeps retrying
  ``open()``; nothing is lost either).
* :func:`entry_outcome` — per-entry batch results: ``SenderFault`` is
  permanent unless the code is a throttling/internal/destination code.

Batch splitting and result collection live in :mod:`._aws_batch`.

botocore's own retries are off by default (``sdk_max_attempts = 1``): the
relay owns backoff (with jitter and circuit breaking), so a throttled batch
frees its thread at once instead of sleeping inside boto3.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import re
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import boto3
import botocore.config
import botocore.exceptions
import botocore.parsers
from pydantic import Field, SecretStr

from outrelay.kit import (
    Event,
    PermanentError,
    Rejected,
    RetryableError,
    RetryLater,
    SendResult,
    TransportConfig,
    TransportError,
    UsageError,
    to_structured,
)

__all__ = [
    "AWSBase",
    "AWSConfig",
    "DeniedError",
    "encoded_size",
    "entry_outcome",
    "fifo_id",
    "map_aws_errors",
    "message_attributes",
    "structured_body",
]

T = TypeVar("T")

# Codes that mean "slow down / try later" whatever the fault flag says.
RETRYABLE_CODES = frozenset({
    "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled", "RequestThrottledException",
    "TooManyRequestsException", "RequestLimitExceeded", "SlowDown", "KMSThrottling", "KmsThrottled",
    "KMS.ThrottlingException", "InternalError", "InternalFailure", "ServiceUnavailable",
    "AWS.SimpleQueueService.InternalError", "RequestTimeout", "RequestTimeoutException",
    "ExpiredToken", "ExpiredTokenException", "RequestExpired",
})  # fmt: skip
# The destination is missing or disabled, not the message: wait for an operator, do not dead-letter at once.
DESTINATION_CODES = frozenset({
    "NotFound", "AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist", "KMSDisabled", "KmsDisabled",
    "KMSNotFound", "KmsNotFound", "KMSInvalidState", "KmsInvalidState", "EndpointDisabled",
})  # fmt: skip
_BAD_CREDENTIALS = (
    "the service does not accept these credentials: fix access_key_id/secret_access_key/session_token "
    "(or the profile or AWS_* environment they come from) and region"
)
_NOT_PERMITTED = (
    "permission denied: allow the action named above for these credentials (their IAM policy, "
    "or the topic/queue policy)"
)
_REFUSED = "HTTP 403: the service refused these credentials; check their permissions and access_key_id"
# Who is asking, not what is sent, is refused: permanent (DeniedError), with how to fix it.
DENIED_CODES: dict[str, str] = {
    "InvalidClientTokenId": _BAD_CREDENTIALS,
    "UnrecognizedClientException": _BAD_CREDENTIALS,
    "SignatureDoesNotMatch": _BAD_CREDENTIALS,
    "IncompleteSignature": _BAD_CREDENTIALS,
    "MissingAuthenticationToken": _BAD_CREDENTIALS,
    "InvalidSecurity": "the request was not secure enough: use an https endpoint_url (and SigV4 signing)",
    "AuthorizationError": _NOT_PERMITTED,
    "AccessDenied": _NOT_PERMITTED,
    "AccessDeniedException": _NOT_PERMITTED,
    "KMSAccessDenied": "permission denied on the KMS key of the topic/queue: allow kms:GenerateDataKey and "
    "kms:Decrypt on it for these credentials",
}
DENIED_CODES["KmsAccessDenied"] = DENIED_CODES["KMSAccessDenied"]
# Amazon's rule for MessageGroupId / MessageDeduplicationId: 1-128 alphanumeric or punctuation characters.
_FIFO_ID_RE = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
SERVICE_LIMIT = 262_144  # 256 KiB: one message (body + attributes) and one batch request


class AWSConfig(TransportConfig):
    """Options shared by ``sns`` and ``sqs``.

    ``message_limit`` is the service's size limit for one encoded message
    (body + attributes) and for one batch request; the declared
    ``max_message_bytes`` of event data is derived from it, leaving room for
    the envelope and base64.
    """

    region: str | None = None
    endpoint_url: str | None = None
    profile: str | None = None
    access_key_id: str | None = None
    secret_access_key: SecretStr | None = None
    session_token: SecretStr | None = None
    fifo: bool | None = Field(None, description="None: a target ending in '.fifo' is FIFO")
    max_workers: int = Field(4, ge=1, le=64, description="threads = concurrent API calls")
    connect_timeout: float = Field(5.0, gt=0, le=120)
    read_timeout: float = Field(30.0, gt=0, le=600)
    sdk_max_attempts: int = Field(1, ge=1, le=10)
    message_limit: int = Field(SERVICE_LIMIT, ge=16_384, le=1_048_576)

    @property
    def max_data_bytes(self) -> int:
        return (self.message_limit - 8192) * 3 // 4


class DeniedError(PermanentError):
    """The service refused the credentials (invalid, or not permitted to make this call).

    It concerns every request these credentials make to the target, not one
    message: a batch request refused with it is not re-sent entry by entry,
    and ``check()`` reports it as is. ``code`` is the service's error code.
    """

    def __init__(self, message: str, *, code: str, destination: str | None = None) -> None:
        self.code = code
        super().__init__(message, destination=destination)


_XML_FIELD = re.compile(r"<(Code|Message)>([^<]*)</\1>")


def _error_fields(response: dict[str, Any]) -> tuple[str, str]:
    """The error's code and one-line message.

    moto (5.x) answers an SQS request in the JSON protocol that it refuses
    *before* dispatch (signature, IAM) with a query-protocol XML body, which
    botocore reports as code ``"403"`` with the XML as message: the XML's own
    ``Code`` and ``Message`` are read back out of it.
    """
    err = response.get("Error", {})
    code, message = str(err.get("Code", "Unknown")), str(err.get("Message", ""))
    if code.isdigit() and "<Code>" in message:
        fields = dict(_XML_FIELD.findall(message))
        code, message = fields.get("Code", code), fields.get("Message", "")
    return code, " ".join(message.split())


@contextlib.contextmanager
def map_aws_errors(what: str, destination: str) -> Iterator[None]:
    """Translate botocore exceptions raised inside the block (see module docstring).

    :raises RetryableError: throttling, 5xx, network, a missing or disabled destination.
    :raises DeniedError: credentials refused or not permitted, or any HTTP 403 (with how to fix it).
    :raises PermanentError: anything else the service refuses as the caller's fault, no credentials/region.
    """
    try:
        yield
    except botocore.exceptions.ClientError as exc:
        code, text = _error_fields(exc.response)
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        msg = f"{what}: {code}: {text}".rstrip(": ")
        if code in RETRYABLE_CODES or status >= 500 or status == 429:
            raise RetryableError(msg, destination=destination) from exc
        if code in DENIED_CODES or status == 403:
            hint = DENIED_CODES.get(code, _REFUSED)
            raise DeniedError(f"{msg} ({hint})", code=code, destination=destination) from exc
        if code in DESTINATION_CODES:
            raise RetryableError(msg + " (fix the destination)", destination=destination) from exc
        raise PermanentError(msg, destination=destination) from exc
    except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError) as exc:
        raise PermanentError(
            f"{what}: no AWS credentials; set access_key_id/secret_access_key, a profile, or the AWS_* environment",
            destination=destination,
        ) from exc
    except botocore.exceptions.NoRegionError as exc:
        raise PermanentError(
            f"{what}: no AWS region; set region or AWS_DEFAULT_REGION", destination=destination
        ) from exc
    except botocore.exceptions.ParamValidationError as exc:
        raise PermanentError(f"{what}: invalid request: {exc}", destination=destination) from exc
    except (botocore.exceptions.ConnectionError, botocore.exceptions.HTTPClientError) as exc:
        raise RetryableError(f"{what}: {type(exc).__name__}: {exc}", destination=destination) from exc
    except botocore.exceptions.BotoCoreError as exc:
        raise RetryableError(f"{what}: {type(exc).__name__}: {exc}", destination=destination) from exc
    except botocore.parsers.ResponseParserError as exc:
        # Not a BotoCoreError: an answer that is not the service's (a proxy's or emulator's error page).
        first = str(exc).split("\n", 1)[0]
        raise RetryableError(f"{what}: unreadable response: {first}", destination=destination) from exc


def entry_outcome(code: str, message: str, sender_fault: bool) -> SendResult:
    """The result for one ``Failed`` entry of a batch response (credentials refused: Rejected, saying why,
    disabling the destination; see the module docstring)."""
    text = f"{code}: {message}"
    if code in DENIED_CODES:
        return Rejected(f"{text} ({DENIED_CODES[code]})", disable_destination=True)
    if code in RETRYABLE_CODES or code in DESTINATION_CODES or not sender_fault:
        return RetryLater(text)
    return Rejected(text)


def fifo_id(value: str) -> str:
    """``value`` if it is a valid MessageGroupId/MessageDeduplicationId, else its SHA-256 (stable)."""
    if _FIFO_ID_RE.match(value):
        return value
    return hashlib.sha256(value.encode()).hexdigest()


def message_attributes(event: Event) -> dict[str, dict[str, str]]:
    """The attributes subscription filter policies need: ``type`` and, when
    set, ``tenant``. The CloudEvent itself is the structured body; these names
    deliberately avoid the ``ce-`` prefix, which would make CloudEvents SDKs
    read the message as binary mode."""
    out = {"type": event.type}
    if event.tenant:
        out["tenant"] = event.tenant
    return {k: {"DataType": "String", "StringValue": v} for k, v in out.items()}


def encoded_size(body: str, attrs: dict[str, dict[str, str]]) -> int:
    """Bytes the service counts: body plus attribute names, types and values."""
    attr_bytes = sum(len(k) + len(v["DataType"]) + len(v["StringValue"].encode()) for k, v in attrs.items())
    return len(body.encode()) + attr_bytes


def structured_body(event: Event) -> str:
    return to_structured(event).decode()


class AWSBase:
    """A boto3 client for one service plus the executor that runs its calls."""

    def __init__(self, service: str, config: AWSConfig, destination: str) -> None:
        self.service = service
        self.aws = config
        self.dest = destination
        self.client: Any = None
        self._pool: ThreadPoolExecutor | None = None
        self._state = "new"

    def _make_client(self) -> Any:
        c = self.aws
        session = boto3.session.Session(
            aws_access_key_id=c.access_key_id,
            aws_secret_access_key=c.secret_access_key.get_secret_value() if c.secret_access_key else None,
            aws_session_token=c.session_token.get_secret_value() if c.session_token else None,
            region_name=c.region,
            profile_name=c.profile,
        )
        cfg = botocore.config.Config(
            connect_timeout=c.connect_timeout,
            read_timeout=c.read_timeout,
            retries={"total_max_attempts": c.sdk_max_attempts, "mode": "standard"},
            max_pool_connections=c.max_workers * 2,
        )
        return session.client(self.service, endpoint_url=c.endpoint_url, config=cfg)

    async def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` in the executor, with errors mapped; never blocks the loop."""
        if self._pool is None:
            raise UsageError(f"{self.service} transport {self.dest!r} is {self._state}, not open")
        loop = asyncio.get_running_loop()

        def run() -> T:
            with map_aws_errors(what, self.dest):
                return fn(*args, **kwargs)

        try:
            future = loop.run_in_executor(self._pool, run)
        except RuntimeError as exc:  # the executor was shut down by close() meanwhile
            raise UsageError(f"{self.service} transport {self.dest!r} is closed") from exc
        return await future

    async def start(self) -> None:
        if self._state == "open":
            return
        self._pool = ThreadPoolExecutor(self.aws.max_workers, thread_name_prefix=f"outrelay-{self.service}")
        self._state = "open"
        try:
            self.client = await self.call(f"{self.service} client setup", self._make_client)
        except BaseException:
            await self.stop()
            raise

    async def stop(self) -> None:
        pool, self._pool = self._pool, None
        if self._state == "open":
            self._state = "closed"
        if pool is not None:
            # Waiting could block on a slow HTTP call; the threads finish by themselves.
            pool.shutdown(wait=False, cancel_futures=True)
        client, self.client = self.client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def ensure_open(self) -> None:
        if self._state != "open":
            raise UsageError(f"{self.service} transport {self.dest!r} is {self._state}, not open")

    def check_error(self, exc: TransportError, what: str) -> TransportError:
        """``exc`` for check() to raise, with a how-to-fix hint (a DeniedError already has its own)."""
        if isinstance(exc, DeniedError):
            return DeniedError(str(exc), code=exc.code, destination=self.dest)
        return type(exc)(f"{exc}; check {what}, endpoint_url/region and credentials", destination=self.dest)
