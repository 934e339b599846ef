"""The open/close state machine every transport needs, written once.

:class:`LifecycleTransport` is a :class:`~outrelay.core.contract.transport.Transport`
whose public ``open``/``send``/``close``/``check`` enforce the contract, so a
subclass writes only its broker's work in ``_open``/``_send``/``_close``::

    new ──open()──▶ open ──close()──▶ closed ──open()──▶ open ...
     │               │  ▲
     │  connection_lost()  connection_restored()
     │               ▼  │
     │            reconnecting ──close()──▶ closed
     └──close()──▶ closed (nothing to release)

* ``open()`` on an open transport does nothing. A failing ``_open`` leaves
  the state as it was (``new`` or ``closed``) after ``_close`` has released
  whatever it half-opened (``_close`` must tolerate that), and the error is
  raised — mapped through :attr:`LifecycleTransport.errors` when it is not
  already an :class:`~outrelay.OutrelayError`.
* ``send()`` is only passed to ``_send`` while open. Before ``open()`` or
  after ``close()`` it raises :class:`~outrelay.UsageError` naming the state.
  An empty batch returns ``[]`` without calling ``_send``. A vendor exception
  escaping ``_send`` is mapped to RetryableError/PermanentError for the
  whole batch (per-message failures should be results, not exceptions).
* ``close()`` is idempotent, and closing a never-opened transport does
  nothing. The state is ``closed`` even if ``_close`` fails (the error is
  mapped and raised once). A closed transport may be opened again: the relay
  and ``outrelay check`` may reopen one instance.
* ``reconnecting``: a transport whose client library reconnects by itself
  (NATS, RabbitMQ) calls :meth:`~LifecycleTransport.connection_lost` from
  its disconnect callback and :meth:`~LifecycleTransport.connection_restored`
  once connected again. Meanwhile ``send()`` raises
  :class:`~outrelay.RetryableError` at once, naming the cause, instead of
  writing into a dead connection (the relay backs off and sends again);
  ``open()`` does nothing (the client is already at it) and ``close()``
  closes as from ``open``.
* ``check()`` opens if needed, returns ``await _check()`` and closes again
  only what it opened itself: checking an open transport leaves it open.
  A failing ``_check`` leaves nothing behind that it opened. While ``check()``
  opens the transport itself, :attr:`~LifecycleTransport.checking` is True, so
  ``_open`` can skip side effects a check must not have (creating a stream).

* typed config and target: ``class KafkaTransport(LifecycleTransport[KafkaConfig])``
  gets ``self.cfg`` typed as ``KafkaConfig``; a transport whose target is one
  templated option sets :attr:`~LifecycleTransport.target_option` (and
  ``target_segment``/``target_alphabet``) and inherits ``target()`` rendering it
  (``destinations.NAME.<option>`` is named in a render error).

``open()`` and ``close()`` are serialised by a lock, so a ``close()`` racing
an ``open()`` runs after it. ``send()`` calls are not serialised: ``_send``
may run concurrently with itself (the relay sends several batches at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from abc import abstractmethod
from collections.abc import Sequence
from typing import ClassVar, Generic, Literal, TypeVar

from outrelay.core.contract.segments import Segment
from outrelay.core.contract.templates import Template
from outrelay.core.contract.transport import Message, SendResult, Transport, TransportConfig
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import OutrelayError, RetryableError, UsageError
from outrelay.kit._errors import ErrorMap

__all__ = ["LifecycleTransport", "State"]

State = Literal["new", "open", "reconnecting", "closed"]

C = TypeVar("C", bound=TransportConfig)

#: the transport whose check() is opening it, in the task running the check (see ``checking``)
_CHECKING: contextvars.ContextVar[object | None] = contextvars.ContextVar("outrelay_checking", default=None)


class LifecycleTransport(Transport, Generic[C]):
    """A transport base carrying the open/close rules (see the module docstring).

    Subclasses implement :meth:`_open`, :meth:`_send` and :meth:`_close`
    (abstract: an incomplete plugin fails when it is instantiated), and may
    override :meth:`_check` and set :attr:`errors`.
    """

    #: how vendor exceptions escaping ``_open``/``_send``/``_close`` are classified;
    #: the default treats every one as retryable (a bug must not dead-letter events)
    errors: ClassVar[ErrorMap] = ErrorMap()
    #: the config option holding the target template (``"topic"``, ``"subject"``, ...);
    #: None: the subclass renders targets itself
    target_option: ClassVar[str | None] = None
    #: the segment rule each substituted value must keep to (see :class:`~outrelay.kit.Template`)
    target_segment: ClassVar[Segment | None] = None
    #: the regex character class a ``name`` segment allows (None: the template's default)
    target_alphabet: ClassVar[str | None] = None

    def __init__(self, config: C, *, destination: str = "default") -> None:
        super().__init__(config, destination=destination)
        self.cfg: C = config
        self._template: Template | None = None
        if self.target_option is not None:
            self._template = Template(
                getattr(config, self.target_option),
                where=f"destinations.{destination}.{self.target_option}",
                segment=self.target_segment,
                alphabet=self.target_alphabet,
            )
        self._state: State = "new"
        self._lost = ""  # why the connection was lost, while reconnecting
        self._lifecycle_lock = asyncio.Lock()

    @property
    def state(self) -> State:
        """``"new"``, ``"open"`` or ``"closed"``."""
        return self._state

    @property
    def is_open(self) -> bool:
        """True while open (not while reconnecting)."""
        return self._state == "open"

    @property
    def checking(self) -> bool:
        """True while :meth:`check` opens the transport, in the task running that check (an
        ``open()`` from another task at the same time sees False): ``_open`` should create
        nothing then."""
        return _CHECKING.get() is self

    def connection_lost(self, reason: str) -> None:
        """The client lost its connection and is reconnecting by itself (see the module docstring)."""
        if self._state == "open":
            self._state = "reconnecting"
            self._lost = reason

    def connection_restored(self) -> None:
        """The client is connected again: sends go through again."""
        if self._state == "reconnecting":
            self._state = "open"
            self._lost = ""

    # -- what a subclass implements ------------------------------------------

    @abstractmethod
    async def _open(self) -> None:
        """Connect. Raise RetryableError (broker down) or PermanentError (fix the config)."""

    @abstractmethod
    async def _send(self, batch: Sequence[Message]) -> list[SendResult]:
        """Publish a non-empty ``batch`` while open; one result per message, in order,
        each reported to :func:`~outrelay.kit.current_progress` as soon as it is known
        (the kit's ordering helpers do that)."""

    @abstractmethod
    async def _close(self) -> None:
        """Release everything ``_open`` acquired; must tolerate a partial ``_open``."""

    async def _check(self) -> str:
        """A short line for ``outrelay check``, called while open."""
        return "reachable"

    # -- the contract ----------------------------------------------------------

    def target(self, event: Event) -> str:
        """The rendered :attr:`target_option` template (a :class:`~outrelay.kit.RejectedTarget`, an
        empty str with a reason, when the event's values cannot be rendered safely); ``""`` (the
        contract's default) when the transport sets no ``target_option`` and does not override it."""
        return "" if self._template is None else self._template.render(event)

    def check_target(self, type: str = "check") -> str:
        """The target a ``_check`` probes: :meth:`target` rendered for a placeholder event of
        ``type`` on stream ``"check"``. Like :meth:`target` it does not raise: a template that
        cannot be rendered from those values gives a :class:`~outrelay.kit.RejectedTarget`."""
        return self.target(Event(type=type, stream="check"))

    def _what(self) -> str:
        return f"{self.name} transport (destination {self.destination!r})"

    async def open(self) -> None:
        """Connect unless already open. :raises RetryableError/PermanentError: see the module docstring."""
        async with self._lifecycle_lock:
            if self._state in ("open", "reconnecting"):
                return
            try:
                with self.errors.boundary(f"{self._what()}: open", destination=self.destination):
                    await self._open()
            except BaseException:
                with contextlib.suppress(Exception):  # the open failure is the error to report
                    await self._close()
                raise
            self._state = "open"

    async def send(self, batch: Sequence[Message]) -> list[SendResult]:
        """Publish ``batch`` (see :meth:`_send`). :raises UsageError: not open."""
        if self._state != "open":
            if self._state == "reconnecting":
                raise RetryableError(
                    f"{self._what()}: connection lost ({self._lost}); the client is reconnecting",
                    destination=self.destination,
                )
            hint = "call open() first" if self._state == "new" else "send() after close(); open() it again"
            raise UsageError(f"{self._what()} is {self._state}, not open: {hint}")
        if not batch:
            return []
        with self.errors.boundary(f"{self._what()}: send", destination=self.destination):
            return await self._send(batch)

    async def close(self) -> None:
        """Disconnect; idempotent, and a no-op on a transport that is not open."""
        async with self._lifecycle_lock:
            if self._state not in ("open", "reconnecting"):
                if self._state == "new":
                    self._state = "closed"
                return
            self._state = "closed"
            with self.errors.boundary(f"{self._what()}: close", destination=self.destination):
                await self._close()

    async def check(self) -> str:
        """Open if needed, probe with :meth:`_check`, close again what was opened here."""
        opened_here = self._state not in ("open", "reconnecting")
        token = _CHECKING.set(self if opened_here else None)
        try:
            await self.open()
        finally:
            _CHECKING.reset(token)
        try:
            with self.errors.boundary(f"{self._what()}: check", destination=self.destination):
                return await self._check()
        finally:
            if opened_here:
                with contextlib.suppress(OutrelayError):  # the check's outcome matters more than a failed close
                    await self.close()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} destination={self.destination!r} state={self._state}>"
