"""outrelay's pluggy hook specifications.

Hooks are for discovery and lifecycle, never the per-message hot path.
Implement them in a module or object decorated with ``outrelay.hookimpl`` and
expose it through the ``outrelay`` entry-point group::

    [project.entry-points.outrelay]
    mytransport = "my_package.outrelay_plugin"

Always call hooks with keyword arguments. Hooks evolve only by adding
arguments; an implementation may accept any subset of them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import pluggy
from pydantic import BaseModel

if TYPE_CHECKING:
    from outrelay.core.contract.transport import Message, SendResult, Transport
    from outrelay.core.model.envelope import Event

__all__ = ["ConfigView", "StoreRegistrar", "TransportRegistrar", "UpcasterRegistrar", "hookimpl", "hookspec"]

hookspec = pluggy.HookspecMarker("outrelay")
hookimpl = pluggy.HookimplMarker("outrelay")


# -------------------------------------------------------------------------
# what the discovery hooks receive
# -------------------------------------------------------------------------
# The registry imports this module to add the hookspecs, the upcasters load
# their plugins through the registry, and the config loader asks the registry
# for the plugins' sections: the hooks name all three by these protocols,
# never by their classes, so that this module imports none of them.

_M = TypeVar("_M", bound=BaseModel)


class ConfigView(Protocol):
    """The ``config`` of :func:`outrelay_send_transform` and :func:`outrelay_bus_configured`:
    an :class:`outrelay.core.config.config.OutrelayConfig`."""

    def section(self, name: str, model: type[_M]) -> _M | None:
        """The plugin section ``name`` as ``model`` (see ``OutrelayConfig.section``)."""


class TransportRegistrar(Protocol):
    """The ``registry`` of :func:`outrelay_add_transports`: an
    :class:`outrelay.core.config.registry.Registry`."""

    def add_transport(
        self,
        name: str,
        target: type[Transport] | str,
        *,
        requires: tuple[str, ...] = (),
        extra: str | None = None,
    ) -> None:
        """Register a transport class (or ``"module:Class"`` path) under ``name``.

        :raises ConfigError: another distribution registered ``name`` already.
        """


class StoreRegistrar(Protocol):
    """The ``registry`` of :func:`outrelay_add_stores`: an
    :class:`outrelay.core.config.registry.Registry`."""

    def add_store(self, scheme: str, target: str) -> None:
        """Register an outbox store (``"module:Class"``) for a URL scheme."""


class UpcasterRegistrar(Protocol):
    """The ``registry`` of :func:`outrelay_add_upcasters`: an
    :class:`outrelay.core.history.upcasting.Upcasters`."""

    def register(
        self, type: str, from_version: str | int, fn: Callable[[Any], Any], *, to_version: str | int | None = None
    ) -> None:
        """Add the step ``type`` ``from_version`` -> ``to_version`` (default: the next whole number).

        :raises EventError: the step is registered already, or goes from a version to itself.
        """


# -------------------------------------------------------------------------
# discovery
# -------------------------------------------------------------------------


@hookspec
def outrelay_add_transports(registry: TransportRegistrar) -> None:
    """Register transports with ``registry.add_transport(name, cls_or_path, ...)``.

    Register by import path (``"pkg.mod:Class"``) with ``requires=`` naming
    the client modules, so a missing client library only fails when the
    transport is configured, with the install hint from ``extra=``.
    """


@hookspec
def outrelay_add_stores(registry: StoreRegistrar) -> None:
    """Register outbox stores by URL scheme with ``registry.add_store(scheme, ...)``."""


@hookspec
def outrelay_config_sections() -> Mapping[str, type[BaseModel]] | None:
    """Return the config file's top-level tables this plugin owns: name -> pydantic model class
    (None or an empty mapping: none).

    The loader validates ``[name]`` with the model (errors read ``name.key: ...``, as the core's
    tables do) and the plugin reads it back with ``config.section(name, model)``. A model whose
    fields all have defaults makes the section default to ``model()``; any other makes it optional
    (None when the table is absent). The model should forbid unknown keys
    (``extra="forbid"``) and be frozen. It may define ``check_config(self, config)`` raising
    ``ValueError`` to check the section against the rest of the file (say, destination names):
    called after the core checked destinations and routes. A name must be an identifier not
    starting with ``_``; one the core holds or another plugin registers is a ``ConfigError``.
    Called when a config is loaded; must not import optional libraries.
    """


# -------------------------------------------------------------------------
# relay lifecycle and outcomes
# -------------------------------------------------------------------------


@hookspec
def outrelay_relay_started(relay: Any) -> None:
    """The relay opened its store and transports and starts working."""


@hookspec
def outrelay_relay_stopped(relay: Any) -> None:
    """The relay stopped; every in-flight batch was settled or released."""


@hookspec
def outrelay_routed(count: int, started: float, finished: float) -> None:
    """The router marked ``count`` (> 0) appended events for their destinations
    in one pass, between ``started`` and ``finished`` (``time.time()``).

    Called once per routing pass that routed something; must not block (the
    tracing plugin records its ``outrelay.route`` span here). On PostgreSQL a
    destination's claim may route new appends in its own transaction: the
    interval then spans that whole transaction, claim included.
    """


@hookspec
def outrelay_batch_settled(
    destination: str,
    messages: Sequence[Message],
    results: Sequence[SendResult],
    elapsed: float,
    timeline: tuple[float, float, float, float, float],
) -> None:
    """A batch was sent and its outcomes written to the outbox.

    Called once per batch (not per message) after settlement; ``elapsed`` is
    the send time in seconds. ``timeline`` gives the batch's phases as
    ``time.time()`` seconds: claim started, claim done, send started, send
    done, settled. Must not block: metrics and tracing plugins record here.
    """


@hookspec
def outrelay_breaker_changed(destination: str, state: str, reason: str) -> None:
    """``destination``'s circuit breaker (:mod:`outrelay.core.relay.breaker`) changed
    ``state``: ``"open"`` (``reason``: the failures that opened it) or
    ``"closed"`` (a probe was delivered). Called once per transition, in the
    event loop; must not block (the metrics plugin counts transitions here).
    """


# -------------------------------------------------------------------------
# event versioning
# -------------------------------------------------------------------------


@hookspec
def outrelay_add_upcasters(registry: UpcasterRegistrar) -> None:
    """Register upcasters with ``registry.register(type, from_version, fn)``.

    Called once per process, when the first event is read through
    :func:`outrelay.core.history.upcasting.default_upcasters`. A step registered by
    two plugins is an error naming type and version.
    """


# -------------------------------------------------------------------------
# payload transforms (encryption); factories, called once, never per message
# -------------------------------------------------------------------------


@hookspec
def outrelay_send_transform(
    config: ConfigView, destination: str, transport: Transport
) -> Callable[[list[Message]], list[Message] | Awaitable[list[Message]]] | None:
    """Return a function the relay applies to each batch for ``destination``
    (whose transport is ``transport``) just before ``transport.send``, or
    None to leave its batches alone.

    Called once per destination when the relay starts; a destination no
    plugin transforms pays nothing per batch. Several results apply in
    plugin order. The function returns as many messages, in the same order;
    a plain function must not raise: to refuse one message (say, it cannot
    be decrypted), give it a :class:`~outrelay.core.contract.segments.RejectedTarget`
    target, and the relay dead-letters it with that reason. An ``async``
    function may do I/O (the claim-check stores payloads) within the
    attempt's ``attempt_timeout``, and may raise ``RetryableError`` or
    ``PermanentError``: the whole batch then fails with it, as if
    ``transport.send`` had raised it. May raise ``ConfigError`` here (a key
    cannot be read), which stops the relay with that line.
    """


@hookspec
def outrelay_bus_configured(config: ConfigView) -> None:
    """:meth:`EventBus.from_config <outrelay.EventBus.from_config>` built a bus
    from ``config``: take what this process's subscribers need from it (the
    crypto plugin installs the ``[crypto]`` keys). May raise ``ConfigError``
    (a key cannot be read): ``from_config`` raises it.
    """


@hookspec
def outrelay_receive_transform(consumer: str) -> Callable[[Event], Event | Awaitable[Event]] | None:
    """Return a function the subscriber runtime applies to each received event
    before upcasting and the handler, or None.

    Called once when subscription ``consumer`` starts. The function may raise
    :class:`~outrelay.EventError` (say, the event is encrypted with a key this
    process does not hold): the event is then dead-lettered at once with
    that reason, as an event that cannot be upcast is. An ``async`` function
    may do I/O (the claim-check fetches payloads) and may raise
    ``RetryableError``: the event stays unacknowledged and its stream waits
    a second before handling it again.
    """
