"""``outrelay.kit``: the one module a transport plugin imports — first-party transports included.

Everything a transport needs, and nothing it should not touch::

    from outrelay.kit import (Capabilities, Delivered, ErrorMap, LifecycleTransport, Message, Rejected,
                              RetryLater, SendResult, Template, TransportConfig, binary_headers,
                              send_in_key_order, transport_plugin)

* the contract — :class:`Transport`, :class:`TransportConfig`,
  :class:`Capabilities`, :class:`Message`, the results :class:`Delivered` /
  :class:`RetryLater` / :class:`NotSent` / :class:`Rejected`, the
  :class:`Event` envelope, the errors (:class:`RetryableError`,
  :class:`PermanentError`, :class:`UsageError`, ...);
* progress — :func:`current_progress` gives the running send's
  :class:`Progress`: report each outcome as soon as the broker confirms it,
  and start no message it refuses (a cut batch then keeps what was confirmed);
* :class:`LifecycleTransport` — the open/close/reconnecting/send-after-close
  state machine, so a transport writes only ``_open``/``_send``/``_close``;
* :class:`ErrorMap` — vendor exceptions to RetryLater/Rejected/RetryableError/
  PermanentError in one table; :func:`redact` masks credentials in messages,
  :func:`mask_url` the password of a URL (the user name stays);
  :class:`DisablingErrorMap` also stops the destination when the credentials are refused;
* ordering helpers — :func:`send_in_key_order`, :func:`send_chained`,
  :func:`send_pipelined`, :func:`hold_after_failures`, :func:`not_sent`,
  :func:`deferred`, :func:`failing_staged`: order per key kept, progress
  reported, the deadline honoured; :func:`send_each` for a sink that answers
  at once (in-process, a local file);
* the consuming side — :class:`Reader` / :class:`Received` (read back what
  was published), :func:`read_until` (a reader's bounded poll loop) and
  :func:`event_from_record` (an Event from a record in either CloudEvents mode),
  :func:`received` (a Received built at half the constructor's cost, for hot paths),
  and the subscription contract :class:`SubscriptionBackend`,
  :class:`SubscriptionSpec`, :class:`Inbound`, :func:`no_ack`;
* :class:`Template` — target templates (``"events.{type}"``) with tenant-safe
  escaping; a render that cannot be made safe is a :class:`RejectedTarget`;
* the CloudEvents binding helpers — :func:`binary_headers` / :func:`from_binary`
  (binary mode under a protocol prefix, ``""`` for none), :func:`attributes` /
  :func:`from_attributes`, :func:`to_structured` / :func:`from_structured` /
  :func:`is_structured` (JSON structured mode, :data:`STRUCTURED_CONTENT_TYPE`);
* TLS — :func:`client_ssl_context`, :func:`certificate_refused`, :func:`tls_hint`; sockets a client
  library left open — :func:`close_writer` (bounded, then aborted);
* registration — :func:`transport_plugin` (one line per transport), or
  :data:`hookimpl` and :class:`Registry` for the ``outrelay_add_transports`` hook.

Names are re-exported from their implementation modules; ``__all__`` is the
public surface and follows semantic versioning (docs/transports.md is the guide).
"""

from outrelay._version import __version__ as outrelay_version
from outrelay.core.config.hookspecs import hookimpl
from outrelay.core.config.registry import Registry
from outrelay.core.contract.progress import Progress, current_progress, sending
from outrelay.core.contract.reading import Reader, Received
from outrelay.core.contract.subscription import Inbound, SubscriptionBackend, SubscriptionSpec, no_ack
from outrelay.core.contract.templates import RejectedTarget, Template
from outrelay.core.contract.transport import (
    Capabilities,
    Delivered,
    Message,
    NotSent,
    Rejected,
    RetryLater,
    SendResult,
    Transport,
    TransportConfig,
)
from outrelay.core.model.cloudevents import (
    STRUCTURED_CONTENT_TYPE,
    attribute_names,
    attributes,
    binary_headers,
    from_attributes,
    from_binary,
    from_structured,
    is_structured,
    to_structured,
)
from outrelay.core.model.envelope import Event, is_json_content_type
from outrelay.core.model.errors import (
    ConfigError,
    EventError,
    MissingExtraError,
    OutrelayError,
    PermanentError,
    RetryableError,
    TransportError,
    UsageError,
)
from outrelay.kit._disable import DisablingErrorMap
from outrelay.kit._each import send_each
from outrelay.kit._errors import ErrorMap, Kind, Rule, redact
from outrelay.kit._lifecycle import LifecycleTransport, State
from outrelay.kit._ordering import (
    deferred,
    failing_staged,
    hold_after_failures,
    not_sent,
    send_chained,
    send_in_key_order,
    send_ordered,
    send_pipelined,
)
from outrelay.kit._plugin import transport_plugin
from outrelay.kit._reading import event_from_record, read_until, received
from outrelay.kit._streams import close_writer
from outrelay.kit._tls import certificate_refused, client_ssl_context, tls_hint
from outrelay.kit._urls import mask_url

__all__ = [
    "STRUCTURED_CONTENT_TYPE",
    "Capabilities",
    "ConfigError",
    "Delivered",
    "DisablingErrorMap",
    "ErrorMap",
    "Event",
    "EventError",
    "Inbound",
    "Kind",
    "LifecycleTransport",
    "Message",
    "MissingExtraError",
    "NotSent",
    "OutrelayError",
    "PermanentError",
    "Progress",
    "Reader",
    "Received",
    "Registry",
    "Rejected",
    "RejectedTarget",
    "RetryLater",
    "RetryableError",
    "Rule",
    "SendResult",
    "State",
    "SubscriptionBackend",
    "SubscriptionSpec",
    "Template",
    "Transport",
    "TransportConfig",
    "TransportError",
    "UsageError",
    "attribute_names",
    "attributes",
    "binary_headers",
    "certificate_refused",
    "client_ssl_context",
    "close_writer",
    "current_progress",
    "deferred",
    "event_from_record",
    "failing_staged",
    "from_attributes",
    "from_binary",
    "from_structured",
    "hold_after_failures",
    "hookimpl",
    "is_json_content_type",
    "is_structured",
    "mask_url",
    "no_ack",
    "not_sent",
    "outrelay_version",
    "read_until",
    "received",
    "redact",
    "send_chained",
    "send_each",
    "send_in_key_order",
    "send_ordered",
    "send_pipelined",
    "sending",
    "tls_hint",
    "to_structured",
    "transport_plugin",
]
