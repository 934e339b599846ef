"""``outrelay.kit``: the one module a transport plugin imports.

Everything a third-party transport needs, and nothing it should not touch::

    from outrelay.kit import (Capabilities, Delivered, ErrorMap, LifecycleTransport, Message, Rejected,
                              RetryLater, SendResult, Template, TransportConfig, binary_headers, hookimpl)

* the contract — :class:`Transport`, :class:`TransportConfig`,
  :class:`Capabilities`, :class:`Message`, the results :class:`Delivered` /
  :class:`RetryLater` / :class:`Rejected`, the consumer side :class:`Reader` /
  :class:`Received`, the :class:`Event` envelope, the errors
  (:class:`RetryableError`, :class:`PermanentError`, :class:`UsageError`, ...);
* :class:`LifecycleTransport` — the open/close/send-after-close state machine,
  so a transport writes only ``_open``/``_send``/``_close``;
* :class:`ErrorMap` — vendor exceptions to RetryLater/Rejected/RetryableError/
  PermanentError in one table; :func:`redact` masks credentials in messages;
* :class:`Template` — target templates (``"events.{type}"``) with tenant-safe
  escaping; a render that cannot be made safe is a :class:`RejectedTarget`;
* the CloudEvents binding helpers — :func:`binary_headers` / :func:`from_binary`
  (binary mode under a protocol prefix, ``""`` for none), :func:`attributes` /
  :func:`from_attributes`, :func:`to_structured` / :func:`from_structured`
  (JSON structured mode, :data:`STRUCTURED_CONTENT_TYPE`);
* ordering helpers — :func:`send_in_key_order`, :func:`send_chained` (also under its former
  name ``send_in_waves``), :func:`send_pipelined`, :func:`hold_after_failures` (keep ``ordered_batches`` honest);
* :data:`hookimpl` and :class:`Registry` for the ``outrelay_add_transports`` hook.

Names are re-exported from their implementation modules; ``__all__`` is the
public surface and follows semantic versioning (docs/transports.md is the guide).
"""

from outrelay.core.cloudevents import (
    STRUCTURED_CONTENT_TYPE,
    attributes,
    binary_headers,
    from_attributes,
    from_binary,
    from_structured,
    to_structured,
)
from outrelay.core.envelope import Event, is_json_content_type
from outrelay.core.errors import (
    ConfigError,
    EventError,
    OutrelayError,
    PermanentError,
    RetryableError,
    TransportError,
    UsageError,
)
from outrelay.core.hookspecs import hookimpl
from outrelay.core.registry import Registry
from outrelay.core.templates import RejectedTarget, Template
from outrelay.core.transport import (
    Capabilities,
    Delivered,
    Message,
    Reader,
    Received,
    Rejected,
    RetryLater,
    SendResult,
    Transport,
    TransportConfig,
    hold_after_failures,
    send_chained,
    send_in_key_order,
    send_in_waves,
    send_pipelined,
)
from outrelay.kit._errors import ErrorMap, Kind, Rule, redact
from outrelay.kit._lifecycle import LifecycleTransport, State

__all__ = [
    "STRUCTURED_CONTENT_TYPE",
    "Capabilities",
    "ConfigError",
    "Delivered",
    "ErrorMap",
    "Event",
    "EventError",
    "Kind",
    "LifecycleTransport",
    "Message",
    "OutrelayError",
    "PermanentError",
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
    "Template",
    "Transport",
    "TransportConfig",
    "TransportError",
    "UsageError",
    "attributes",
    "binary_headers",
    "from_attributes",
    "from_binary",
    "from_structured",
    "hold_after_failures",
    "hookimpl",
    "is_json_content_type",
    "redact",
    "send_chained",
    "send_in_key_order",
    "send_in_waves",
    "send_pipelined",
    "to_structured",
]
