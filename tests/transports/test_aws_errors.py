"""The ``sns``/``sqs`` error table (``outrelay.transports.aws._errors``): botocore's answers to outcomes.

The botocore exceptions are built as botocore builds them from a service's
answer (no client is mocked); the transports' tests show the same table
against moto.
"""

from __future__ import annotations

import botocore.exceptions
import botocore.parsers
import pytest

from outrelay import PermanentError, Rejected, RetryableError, RetryLater
from outrelay.transports.aws._errors import DeniedError, entry_outcome, service_error, to_error


def client_error(code: str, status: int, message: str = "m") -> botocore.exceptions.ClientError:
    response = {"Error": {"Code": code, "Message": message}, "ResponseMetadata": {"HTTPStatusCode": status}}
    return botocore.exceptions.ClientError(response, "SendMessageBatch")


@pytest.mark.parametrize(
    ("code", "status", "kind"),
    [
        ("RequestThrottled", 400, RetryableError),
        ("InternalError", 500, RetryableError),
        ("Anything", 503, RetryableError),
        ("AWS.SimpleQueueService.NonExistentQueue", 400, RetryableError),
        ("InvalidClientTokenId", 403, DeniedError),
        ("AccessDenied", 403, DeniedError),
        ("KmsAccessDenied", 400, DeniedError),
        ("Whatever", 403, DeniedError),
        ("InvalidParameterValue", 400, PermanentError),
    ],
)
def test_codes_classified(code: str, status: int, kind: type[Exception]) -> None:
    """Throttling, 5xx and a missing destination retry; refused credentials are DeniedError; the rest is permanent."""
    err = to_error(service_error(client_error(code, status)), "sqs SendMessageBatch q", "d")
    assert type(err) is kind
    assert code in str(err) and err.destination == "d"


def test_moto_xml_read_out() -> None:
    """A JSON-protocol refusal answered in XML (moto, before dispatch) gives the XML's own code and message."""
    xml = "<ErrorResponse><Error><Code>AccessDenied</Code><Message>User x is not authorized</Message></Error>"
    err = to_error(service_error(client_error("403", 403, xml)), "sqs SendMessageBatch q", "d")
    assert isinstance(err, DeniedError) and err.code == "AccessDenied"
    assert "<" not in str(err) and "not authorized" in str(err) and "permission denied" in str(err)


def test_entry_outcomes() -> None:
    """A failed batch entry: sender fault is Rejected, else RetryLater; refused credentials disable."""
    assert isinstance(entry_outcome("InvalidParameterValue", "too long", True, "e"), Rejected)
    assert isinstance(entry_outcome("InvalidParameterValue", "x", False, "e"), RetryLater)
    assert isinstance(entry_outcome("KMSThrottling", "x", True, "e"), RetryLater)
    denied = entry_outcome("AccessDenied", "x", True, "e")
    assert isinstance(denied, Rejected) and denied.disable_destination


def test_no_credentials_and_unreadable() -> None:
    """No credentials is permanent and says what to set; a non-service answer is retryable, its first line only."""
    err = to_error(service_error(botocore.exceptions.NoCredentialsError()), "sqs open", "d")
    assert type(err) is PermanentError and "access_key_id" in str(err)
    page = botocore.parsers.ResponseParserError("Unable to parse response\n<html>" + "x" * 500)
    err = to_error(service_error(page), "sqs open", "d")
    assert type(err) is RetryableError and "<html>" not in str(err)
