"""An :class:`~outrelay.kit.ErrorMap` whose "the caller is refused" errors stop the destination.

Credentials that are refused, or that lack the right to publish, fail every
message alike: retrying them for ever helps nobody and dead-lettering them
loses events that a fixed role would deliver. The conformance suite's rule:
such a failure is :class:`~outrelay.kit.Rejected` with
``disable_destination=True`` (the relay stops the destination, its events
stay pending until an operator runs ``outrelay enable``), and from
``open``/``check`` a :class:`~outrelay.kit.PermanentError`::

    ERRORS = DisablingErrorMap(
        (AuthError, "reject", "not allowed to publish (fix the credentials, then `outrelay enable`)"),
        (TimeoutError, "retry"),
        disable=AuthError,
    )
"""

from __future__ import annotations

from outrelay.core.contract.transport import Rejected, SendResult
from outrelay.core.model.errors import OutrelayError
from outrelay.kit._errors import ErrorMap, Kind, Match, Rule

__all__ = ["DisablingErrorMap"]


class DisablingErrorMap(ErrorMap):
    """An :class:`ErrorMap` with ``disable``: what matches it (a class, a tuple of classes or a
    predicate, as a rule's match) is ``"reject"``, and its per-message :meth:`result` is
    ``Rejected(..., disable_destination=True)``. The message still takes the hint of the first
    matching rule (give one saying what to grant). OutrelayErrors are never re-mapped.

    ``chain=False``: :meth:`boundary` raises its error ``from None``, for a client library whose
    exception texts may quote a secret (the error's own message is redacted; a chained cause is not)."""

    __slots__ = ("chain", "disable")

    def __init__(
        self,
        *rules: Rule | tuple[Match, Kind] | tuple[Match, Kind, str],
        disable: Match = (),
        default: Kind = "retry",
        chain: bool = True,
    ) -> None:
        """:raises ValueError: as :class:`ErrorMap`."""
        super().__init__(*rules, default=default)
        self.disable = Rule(disable, "reject")
        self.chain = chain

    def disables(self, exc: BaseException) -> bool:
        """Whether ``exc`` says the caller itself is refused."""
        return not isinstance(exc, OutrelayError) and self.disable.matches(exc)

    def kind(self, exc: BaseException) -> Kind:
        """``"reject"`` for what :meth:`disables`, else as :meth:`ErrorMap.kind`."""
        return "reject" if self.disables(exc) else super().kind(exc)

    def result(self, exc: BaseException, what: str = "") -> SendResult:
        """As :meth:`ErrorMap.result`; ``Rejected(disable_destination=True)`` for what :meth:`disables`."""
        if self.disables(exc):
            return Rejected(self.message(exc, what), disable_destination=True)
        return super().result(exc, what)

    def _cause(self, exc: BaseException) -> BaseException | None:
        """``exc``, or None with ``chain=False`` (see the class docstring)."""
        return exc if self.chain else None
