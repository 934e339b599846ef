"""The one boundary where botocore exceptions become outrelay outcomes: :data:`ERRORS`.

:func:`service_error` first reads a botocore exception out into a plain
:class:`ServiceError` (code, HTTP status, one-line message) or
:class:`UnreadableResponse`, so the table matches on codes and no XML or
HTML page ends up in a message. Then:

* throttling, 5xx, 429, timeouts and connection failures are retryable;
* a missing or disabled queue/topic or KMS key is retryable (the message is
  fine; an operator must create the destination), so events wait, then
  dead-letter after the retry policy is exhausted;
* credentials the service does not accept (``InvalidClientTokenId``,
  ``SignatureDoesNotMatch``...) or that may not do the call
  (``AccessDenied``, SNS ``AuthorizationError``, ``KmsAccessDenied``, any
  HTTP 403) are :class:`DeniedError`, a :class:`~outrelay.PermanentError`
  whose message says what to fix: never retried for ever (the conformance
  contract for credentials without permission). In ``send()`` results it is
  ``Rejected(disable_destination=True)``: the relay disables the destination
  and keeps its events pending — no event is dead-lettered because a policy
  changed — until an operator fixes the credentials and runs
  ``outrelay enable NAME``. ``open()`` raises it (the relay keeps retrying
  ``open()``; nothing is lost either);
* anything else the service refuses as the caller's fault (``InvalidParameter``,
  too long, ...), no credentials, no region or an invalid request is permanent.

Per-entry batch failures go through the same table (:func:`entry_outcome`):
a ``Failed`` entry without ``SenderFault`` counts as a 5xx.
Messages are redacted by the kit (:func:`~outrelay.kit.redact`); the
configured secrets are never part of a botocore message.
"""

from __future__ import annotations

import re
from typing import Any

import botocore.exceptions
import botocore.parsers

from outrelay.kit import ErrorMap, PermanentError, Rejected, Rule, SendResult, TransportError

__all__ = ["ERRORS", "DeniedError", "ServiceError", "UnreadableResponse", "entry_outcome", "service_error", "to_error"]

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
BAD_CREDENTIAL_CODES = frozenset({
    "InvalidClientTokenId", "UnrecognizedClientException", "SignatureDoesNotMatch", "IncompleteSignature",
    "MissingAuthenticationToken",
})  # fmt: skip
NOT_PERMITTED_CODES = frozenset({"AuthorizationError", "AccessDenied", "AccessDeniedException"})
KMS_DENIED_CODES = frozenset({"KMSAccessDenied", "KmsAccessDenied"})


class ServiceError(Exception):
    """A refusal by the service, read out of botocore's ``ClientError``.

    ``status`` is the HTTP status (0 unknown; a failed batch entry without
    ``SenderFault`` gets 500); ``str()`` is ``"<code>: <message>"``.
    """

    def __init__(self, code: str, status: int, message: str) -> None:
        self.code, self.status, self.text = code, status, message
        super().__init__(f"{code}: {message}".rstrip(": "))


class UnreadableResponse(Exception):
    """An answer that is not the service's (a proxy's or emulator's error page); its first line."""


class DeniedError(PermanentError):
    """The service refused the credentials (invalid, or not permitted to make this call).

    It concerns every request these credentials make to the target, not one
    message: a batch request refused with it is not re-sent entry by entry,
    and ``check()`` reports it as is. ``code`` is the service's error code.
    """

    def __init__(self, message: str, *, code: str, destination: str | None = None) -> None:
        self.code = code
        super().__init__(message, destination=destination)


def _codes(codes: frozenset[str]) -> Any:
    return lambda e: isinstance(e, ServiceError) and e.code in codes


def _transient(e: BaseException) -> bool:
    return isinstance(e, ServiceError) and (e.code in RETRYABLE_CODES or e.status >= 500 or e.status == 429)


_BAD_CREDENTIALS = (
    "the service does not accept these credentials: fix access_key_id/secret_access_key/session_token "
    "(or the profile or AWS_* environment they come from) and region"
)
#: the rules whose refusals are DeniedError (the credentials, not the message)
DENIED_RULES = (
    Rule(_codes(BAD_CREDENTIAL_CODES), "reject", _BAD_CREDENTIALS),
    Rule(
        _codes(frozenset({"InvalidSecurity"})),
        "reject",
        "the request was not secure enough: use an https endpoint_url (and SigV4 signing)",
    ),
    Rule(
        _codes(NOT_PERMITTED_CODES),
        "reject",
        "permission denied: allow the action named above for these credentials (their IAM policy, "
        "or the topic/queue policy)",
    ),
    Rule(
        _codes(KMS_DENIED_CODES),
        "reject",
        "permission denied on the KMS key of the topic/queue: allow kms:GenerateDataKey and "
        "kms:Decrypt on it for these credentials",
    ),
    Rule(
        lambda e: isinstance(e, ServiceError) and e.status == 403,
        "reject",
        "HTTP 403: the service refused these credentials; check their permissions and access_key_id",
    ),
)

#: the table (see the module docstring); the first matching rule wins
ERRORS = ErrorMap(
    Rule(_transient, "retry"),
    *DENIED_RULES,
    Rule(_codes(DESTINATION_CODES), "retry", "the topic/queue (or its KMS key) is missing or disabled: fix it"),
    Rule(ServiceError, "reject"),
    Rule(
        (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError),
        "reject",
        "no AWS credentials; set access_key_id/secret_access_key, a profile, or the AWS_* environment",
    ),
    Rule(botocore.exceptions.NoRegionError, "reject", "no AWS region; set region or AWS_DEFAULT_REGION"),
    Rule(botocore.exceptions.ParamValidationError, "reject", "invalid request"),
    Rule(botocore.exceptions.BotoCoreError, "retry"),  # connection, HTTP client, timeouts
    Rule(UnreadableResponse, "retry", "unreadable response"),
)

_XML_FIELD = re.compile(r"<(Code|Message)>([^<]*)</\1>")


def service_error(exc: BaseException) -> BaseException:
    """``exc`` read out for :data:`ERRORS`: a ``ClientError`` becomes a :class:`ServiceError`, a
    ``ResponseParserError`` an :class:`UnreadableResponse`; anything else is returned as is.

    moto (5.x) answers an SQS request in the JSON protocol that it refuses
    *before* dispatch (signature, IAM) with a query-protocol XML body, which
    botocore reports as code ``"403"`` with the XML as message: the XML's own
    ``Code`` and ``Message`` are read back out of it.
    """
    if isinstance(exc, botocore.parsers.ResponseParserError):
        return UnreadableResponse(str(exc).split("\n", 1)[0])
    if not isinstance(exc, botocore.exceptions.ClientError):
        return exc
    err = exc.response.get("Error", {})
    code, message = str(err.get("Code", "Unknown")), str(err.get("Message", ""))
    if code.isdigit() and "<Code>" in message:
        fields = dict(_XML_FIELD.findall(message))
        code, message = fields.get("Code", code), fields.get("Message", "")
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    return ServiceError(code, status, " ".join(message.split()))


def _denied(exc: BaseException) -> bool:
    return ERRORS.rule(exc) in DENIED_RULES


def to_error(exc: BaseException, what: str, destination: str) -> TransportError:
    """The error for a failed call (``exc`` as :func:`service_error` returns it).

    :returns: :class:`DeniedError` for refused credentials, else ERRORS' RetryableError/PermanentError.
    """
    if _denied(exc):
        code = exc.code if isinstance(exc, ServiceError) else type(exc).__name__
        return DeniedError(ERRORS.message(exc, what), code=code, destination=destination)
    return ERRORS.error(exc, what, destination=destination)


def entry_outcome(code: str, message: str, sender_fault: bool, what: str) -> SendResult:
    """The result for one ``Failed`` entry of a batch response: RetryLater or Rejected through
    :data:`ERRORS`; credentials refused are Rejected with ``disable_destination``."""
    text = " ".join(message.split())
    exc = ServiceError(code, 400, text)
    if _denied(exc):
        return Rejected(ERRORS.message(exc, what), disable_destination=True)
    return ERRORS.result(exc if sender_fault else ServiceError(code, 500, text), what)
