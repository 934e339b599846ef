"""The one error table of the ``pubsub`` transport (google-api-core / gRPC exceptions).

Per message: UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED and NOT_FOUND
are RetryLater (fixable without losing the event); INVALID_ARGUMENT and a
message too large are Rejected; PERMISSION_DENIED / UNAUTHENTICATED are
Rejected with ``disable_destination`` (credentials that may not publish would
otherwise be retried for ever; the destination stops and its events stay
pending until the role is granted and an operator runs ``outrelay enable``).
From ``open``/``check`` the same table raises RetryableError/PermanentError;
missing Application Default Credentials are a PermanentError saying how to
provide them. Anything unknown is retried.
"""

from __future__ import annotations

from google.api_core import exceptions as gexc
from google.auth import exceptions as aexc
from google.cloud.pubsub_v1.publisher import exceptions as pexc

from outrelay.kit import DisablingErrorMap

__all__ = ["ERRORS", "PAUSED"]

#: why a message of an ordering key paused by an earlier failure was not published
PAUSED = "an earlier message with this ordering key failed"

_REFUSED = (gexc.PermissionDenied, gexc.Unauthenticated)

ERRORS = DisablingErrorMap(
    (pexc.PublishToPausedOrderingKeyException, "retry", PAUSED),
    (pexc.MessageTooLargeError, "reject", "message too large for Pub/Sub"),
    (gexc.InvalidArgument, "reject", "Pub/Sub rejected the message (INVALID_ARGUMENT)"),
    (gexc.NotFound, "retry", "topic not found (create it or fix destinations.*.topic)"),
    (
        _REFUSED,
        "reject",
        "not allowed to publish (grant roles/pubsub.publisher, or fix the credentials, then `outrelay enable` "
        "the destination)",
    ),
    (
        aexc.DefaultCredentialsError,
        "reject",
        "no Google credentials (set credentials_file, run `gcloud auth application-default login`, "
        "or set emulator_host)",
    ),
    (gexc.GoogleAPICallError, "retry"),
    (TimeoutError, "retry"),
    (RuntimeError, "retry", "publisher unusable"),  # the library's "publisher stopped" and friends
    disable=_REFUSED,
)
