"""Map a client library's exceptions to outrelay's outcomes, in one table.

::

    ERRORS = ErrorMap(
        (ConnectionRefusedError, "retry", "is the broker running?"),
        (lambda e: isinstance(e, ClientError) and e.code == 5, "reject", "not authorised: fix username/password"),
        (TimeoutError, "retry"),
        (ValueError, "reject"),
    )

    with ERRORS.boundary("open", destination=self.destination):   # raises RetryableError / PermanentError
        await client.connect()
    results.append(ERRORS.result(exc))                            # RetryLater / Rejected for one message

A rule is ``(match, kind)`` or ``(match, kind, hint)``: ``match`` is an
exception class, a tuple of classes, or a predicate ``exc -> bool``;
``kind`` is ``"retry"`` (transient: RetryLater / RetryableError) or
``"reject"`` (retrying will not help: Rejected / PermanentError). The first
matching rule wins; an exception no rule matches gets ``default`` (``"retry"``:
an unknown failure must not dead-letter events).
:class:`~outrelay.OutrelayError` subclasses are never re-mapped: they pass
through :meth:`ErrorMap.boundary` unchanged. Messages are one line,
``"<what>: <hint> (<ExceptionType>: <text>)"``, with ``user:password@`` in
URLs and ``password=``/``token=`` style values masked; the vendor exception
is chained as ``__cause__``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Callable, Iterator
from typing import Literal, TypeAlias

from outrelay.core.contract.transport import Rejected, RetryLater, SendResult
from outrelay.core.model.errors import OutrelayError, PermanentError, RetryableError, TransportError

__all__ = ["ErrorMap", "Kind", "Rule", "redact"]

Kind = Literal["retry", "reject"]
Match: TypeAlias = type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool]

_URL_USERINFO = re.compile(r"(?<=://)[^/@\s]+@")
_SECRET_VALUE = re.compile(r"(?i)\b(password|passwd|pwd|token|secret|api[_-]?key|sharedaccesskey|sig)=([^\s;&,]+)")


def redact(text: str) -> str:
    """``text`` with URL credentials and ``password=``-style values replaced by ``***``."""
    text = _URL_USERINFO.sub("***@", text)
    return _SECRET_VALUE.sub(lambda m: f"{m.group(1)}=***", text)


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """One row of an :class:`ErrorMap`. ``retry_after``: seconds, or a function of the exception."""

    match: Match
    kind: Kind
    hint: str = ""
    retry_after: float | Callable[[BaseException], float | None] | None = None

    def matches(self, exc: BaseException) -> bool:
        m = self.match
        if isinstance(m, type | tuple):
            return isinstance(exc, m)
        return bool(m(exc))


class ErrorMap:
    """An ordered table of :class:`Rule` (see the module docstring)."""

    __slots__ = ("default", "rules")

    def __init__(self, *rules: Rule | tuple[Match, Kind] | tuple[Match, Kind, str], default: Kind = "retry") -> None:
        """:raises ValueError: a rule whose kind is not ``"retry"``/``"reject"``."""
        built: list[Rule] = []
        for r in rules:
            rule = r if isinstance(r, Rule) else Rule(*r)
            if rule.kind not in ("retry", "reject"):
                raise ValueError(f"ErrorMap rule {rule!r}: kind must be 'retry' or 'reject', not {rule.kind!r}")
            built.append(rule)
        if default not in ("retry", "reject"):
            raise ValueError(f"ErrorMap default must be 'retry' or 'reject', not {default!r}")
        self.rules: tuple[Rule, ...] = tuple(built)
        self.default: Kind = default

    def rule(self, exc: BaseException) -> Rule | None:
        """The first rule matching ``exc``, or ``None``."""
        return next((r for r in self.rules if r.matches(exc)), None)

    def kind(self, exc: BaseException) -> Kind:
        """``"retry"`` or ``"reject"`` for ``exc`` (OutrelayErrors by their own class)."""
        if isinstance(exc, PermanentError):
            return "reject"
        if isinstance(exc, OutrelayError):
            return "retry"
        r = self.rule(exc)
        return r.kind if r is not None else self.default

    def message(self, exc: BaseException, what: str = "") -> str:
        """One redacted line describing ``exc`` (see the module docstring)."""
        r = self.rule(exc)
        detail = " ".join(str(exc).split())
        cause = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
        head = ": ".join(p for p in (what, r.hint if r else "") if p)
        return redact(f"{head} ({cause})" if head else cause)

    def _retry_after(self, exc: BaseException) -> float | None:
        r = self.rule(exc)
        if r is None or r.retry_after is None:
            return None
        return r.retry_after(exc) if callable(r.retry_after) else r.retry_after

    def result(self, exc: BaseException, what: str = "") -> SendResult:
        """The per-message outcome for ``exc``: :class:`RetryLater` or :class:`Rejected`."""
        if isinstance(exc, OutrelayError):
            text = str(exc)
            if isinstance(exc, PermanentError):
                return Rejected(text)
            return RetryLater(text, exc.retry_after if isinstance(exc, RetryableError) else None)
        if self.kind(exc) == "reject":
            return Rejected(self.message(exc, what))
        return RetryLater(self.message(exc, what), self._retry_after(exc))

    def error(self, exc: BaseException, what: str = "", *, destination: str | None = None) -> TransportError:
        """The whole-operation error for ``exc``: :class:`RetryableError` or :class:`PermanentError`."""
        msg = self.message(exc, what)
        if self.kind(exc) == "reject":
            return PermanentError(msg, destination=destination)
        return RetryableError(msg, retry_after=self._retry_after(exc), destination=destination)

    @contextlib.contextmanager
    def boundary(self, what: str = "", *, destination: str | None = None) -> Iterator[None]:
        """Re-raise any non-outrelay exception of the block as :meth:`error` (``from`` it).

        OutrelayErrors, ``asyncio.CancelledError`` and other BaseExceptions pass unchanged.
        """
        try:
            yield
        except OutrelayError:
            raise
        except Exception as exc:
            raise self.error(exc, what, destination=destination) from self._cause(exc)

    def _cause(self, exc: BaseException) -> BaseException | None:
        """What :meth:`boundary` chains its error to (its ``__cause__``): ``exc``."""
        return exc

    def __repr__(self) -> str:
        return f"<ErrorMap {len(self.rules)} rules, default={self.default!r}>"
