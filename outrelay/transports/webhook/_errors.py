"""The webhook's one error table: HTTP client exceptions to outrelay outcomes.

Used by :meth:`~._transport.WebhookTransport._post` (one result per message,
:meth:`~outrelay.kit.ErrorMap.result`) and by ``check()`` (one raised
error, :meth:`~outrelay.kit.ErrorMap.boundary`); what an HTTP *answer*
means is :mod:`._answers`. Messages name the URL through
:func:`~._http.safe_url` (no user info, query or fragment) and never quote a
secret or a header value.
"""

from __future__ import annotations

from outrelay.kit import ErrorMap, certificate_refused
from outrelay.transports.webhook._client import AnswerTimeout
from outrelay.transports.webhook._http import InvalidRequest, ProtocolError
from outrelay.transports.webhook._ssrf import PrivateAddressRefused

__all__ = ["ERRORS"]

ERRORS = ErrorMap(
    (PrivateAddressRefused, "reject"),  # its text names allow_private_network
    (InvalidRequest, "reject", "fix the destination's url or headers"),
    (AnswerTimeout, "retry", "raise the destination's timeout if the receiver is that slow"),
    (ProtocolError, "retry", "the receiver sent an invalid HTTP answer"),
    (
        lambda e: certificate_refused(e) is not None,
        "retry",
        "its TLS certificate was refused: check the URL's host name and the receiver's certificate chain",
    ),
    (OSError, "retry", "check the URL and that the receiver is up"),
)
