"""What a test module gives the conformance suite: :class:`ConformanceTarget`
(re-exported as :class:`outrelay.conformance.ConformanceTarget`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable, Mapping

from outrelay.conformance._binding import Binding
from outrelay.core.contract.transport import Reader, Transport

__all__ = ["ConformanceTarget"]


@dataclasses.dataclass(frozen=True)
class ConformanceTarget:
    """How the suite reaches a transport under test.

    * ``make_transport(target)`` — a new, unopened transport whose
      ``target(event)`` is ``target`` for every event.
    * ``provision(name)`` — create a fresh target (topic, queue, ...) from a
      unique name and return the target string to use; ``None`` when any
      name works as is.
    * ``make_unreachable(target)`` — the same transport configured against
      an endpoint where nothing listens (for the broker-down checks); ``None``
      skips those checks with a reason.
    * ``label`` — what the peer is, shown in the report (say so when it is a
      test double of the wire protocol rather than the real service).
    * ``read_timeout`` — how long a check waits for messages to be read back.
    * ``timeout`` — the bound on every single ``open``/``send``/``close``/
      ``check`` call; a call that takes longer fails the check as a hang.
    * ``isolated`` — ``True`` when every check gets a target of its own.
      ``False`` means ``make_transport`` ignores its argument and all checks
      share one pre-existing target: readers then ignore messages the check
      did not send, and checks that need their own target skip.

    Optional hooks of the v2 checks; a check whose hook is absent skips with
    "the target declares no <hook>":

    * ``upstream(target)`` — the ``(host, port)`` of the broker serving
      ``target``, and ``make_transport_via(target, host, port)`` — the same
      transport pointed at ``host:port`` instead. Together they let the fault
      checks put a :class:`~outrelay.conformance._proxy.TcpProxy` in between
      (cut, reset, black hole, stall).
    * ``refuse_target(target)`` — a target on the same broker that the broker
      refuses per message (a missing stream, a path answering 400...), made
      so (a coroutine).
    * ``make_forbidden(target)`` — the transport with credentials that may
      connect but not publish (or are refused outright).
    * ``throttle(target)`` — make the broker throttle ``target`` from now on,
      returning the retry hint in seconds it gives (a coroutine).
    * ``secret`` — a secret string (password, token, signing key) every
      transport made by these callables is configured with; the suite greps
      results, exceptions, ``check()`` output, reprs and logs for it.
    * ``cleanup(target)`` — delete what a check left on the broker under a
      target it made (streams, topics, queues, files); awaited when the check
      ends, after its transports closed. Errors there are ignored.
    * ``binding`` — the CloudEvents binding the transport implements (see
      :class:`~outrelay.conformance.Binding`); ``None`` skips the binding checks.
    * ``unsupported`` — for optional hooks left out on purpose, why (hook name
      → reason, e.g. ``{"throttle": "the broker never throttles with a retry
      hint"}``): the check still skips, and its reason says why, so the report
      shows a declared limitation of the broker or its test peer rather than
      an oversight. Names: ``upstream``, ``refuse_target``, ``make_forbidden``,
      ``throttle``, ``secret``, ``binding``, ``late_reader``.

    The consumer-side checks (``subscription_*``, for a transport declaring
    ``capabilities.subscriptions``; :mod:`outrelay.conformance._checks_subscription`):

    * ``claim_timeout`` — the ``SubscriptionSpec.claim_timeout`` their members
      use: the smallest your broker accepts keeps them quick (stock Kafka: 6 s).
    * ``publish_foreign(target)`` — put on ``target`` a message that is not an
      outrelay CloudEvent, with the broker's own client (a coroutine).
    * ``forget_group(target, group)`` — delete what a consumer group left on the
      broker (durable queues, consumers, offsets); awaited when the check ends,
      errors ignored.
    * ``unsupported`` names, besides the hooks: ``processes`` (members cannot
      live in other processes: an in-process broker) and ``from_beginning``
      (the broker cannot start a new group at the target's beginning).

    Optional hook of the v3 checks:

    * ``late_reader(transport, target)`` — a reader that, started *after*
      messages were sent to ``target``, reads what the broker kept (Kafka or a
      Redis stream from the beginning, a JetStream consumer delivering all).
      The durability check uses it for a transport declaring ``delivery =
      "at_least_once"``; without it, ``transport.reader(target)`` started
      after the send must find the messages. A broker that keeps messages only
      for subscriptions that exist when they are sent (an AMQP exchange, a
      Pub/Sub or SNS topic) declares it in ``unsupported``.
    """

    make_transport: Callable[[str], Transport]
    provision: Callable[[str], Awaitable[str]] | None = None
    make_unreachable: Callable[[str], Transport] | None = None
    label: str = ""
    read_timeout: float = 15.0
    timeout: float = 10.0
    isolated: bool = True
    upstream: Callable[[str], tuple[str, int]] | None = None
    make_transport_via: Callable[[str, str, int], Transport] | None = None
    refuse_target: Callable[[str], Awaitable[str]] | None = None
    make_forbidden: Callable[[str], Transport] | None = None
    throttle: Callable[[str], Awaitable[float]] | None = None
    claim_timeout: float = 6.0
    publish_foreign: Callable[[str], Awaitable[None]] | None = None
    forget_group: Callable[[str, str], Awaitable[None]] | None = None
    secret: str | None = dataclasses.field(default=None, repr=False)
    binding: Binding | None = None
    cleanup: Callable[[str], Awaitable[None]] | None = None
    unsupported: Mapping[str, str] = dataclasses.field(default_factory=dict)
    late_reader: Callable[[Transport, str], Reader] | None = None
