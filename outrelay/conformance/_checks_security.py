"""Security checks: hostile attribute values, secrets that must never show, credentials without permission.

* Event construction already refuses control characters (CR, LF, NUL...) in
  every text field, so the hostile values here are the ones that *can* reach a
  transport: printable header-injection look-alikes (``a: b``, ``%0D%0A``,
  ``;``, quotes), very long values and non-ASCII text. Each event round-trips
  exactly or is Rejected; none adds a header of its own.
* ``ConformanceTarget.secret`` is a string the transport is configured with;
  it must not appear in send results, exceptions (with their causes and
  notes), ``check()`` output, reprs, or log records at any level.
* ``ConformanceTarget.make_forbidden`` builds the transport with credentials
  that may not publish: that must be permanent (Rejected / a non-retryable
  error), never retried for ever, and ``check()`` must say what to fix.
"""

from __future__ import annotations

import contextlib
import logging
import traceback
from collections.abc import Iterator
from urllib.parse import quote

from outrelay.conformance._harness import CheckFailed, CheckSkipped, Context, assert_same, by_id, check, guarded, short
from outrelay.core.contract.transport import Delivered, Message, Rejected, RetryLater, Transport
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import OutrelayError, RetryableError, TransportError

__all__: list[str] = []

#: words one of which a check() failure about credentials must contain, so an operator knows what to fix
FIX_WORDS = ("permission", "denied", "forbidden", "unauthori", "not authori", "credential", "auth", "access",
             "password", "token", "key", "acl", "401", "403", "refused")  # fmt: skip
HOSTILE = {
    "header-line": "x-injected: 1",
    "crlf-escaped": "a%0D%0Ax-injected:%201",
    "backslash-crlf": "a\\r\\nx-injected: 1",
    "cookie": 'Set-Cookie: session=abc; Path=/; HttpOnly; x="y"',
    "quotes": "\"double\" 'single' `back`",
    "separators": "a;b,c:d=e&f?g#h",
    "percent": "100% %zz %%",
    "non-ascii": "ünïcödé ✓ 日本語 🚀",
}


def hostile_events(ctx: Context, long_value: int) -> list[Event]:
    """Events whose attributes carry the :data:`HOSTILE` values (one field each), and a very long one."""
    return [
        ctx.event("hostile-meta", data=b"m", metadata=HOSTILE),
        ctx.event("hostile-subject", data=b"s", subject=HOSTILE["header-line"], tenant=HOSTILE["cookie"]),
        ctx.event(
            "hostile; stream: x",
            data=b"k",
            correlation_id=HOSTILE["crlf-escaped"],
            causation_id=HOSTILE["quotes"],
            producer_version=HOSTILE["separators"],
            labels={"l": HOSTILE["percent"], "ü": HOSTILE["non-ascii"]},
        ),
        ctx.event("hostile-id", id='id:1;x="y"%0D%0A', data=b"i", subject=HOSTILE["backslash-crlf"]),
        ctx.event("hostile-long", data=b"l", subject="s" * long_value, metadata={"long": "v" * long_value}),
    ]


@check
async def hostile_attributes(ctx: Context) -> None:
    """Attribute values that look like header injection (``a: b``, ``%0D%0A``, ``;``, quotes), very long values
    and non-ASCII text round-trip exactly or are Rejected, and never add a header of their own."""
    s = await ctx.session()
    long_value = 4096
    if s.caps.max_header_bytes is not None:
        long_value = max(16, min(long_value, s.caps.max_header_bytes // 4))
    events = hostile_events(ctx, long_value)
    results = await s.send(events, what="send() of events with hostile attribute values")
    delivered = []
    for e, r in zip(events, results, strict=True):
        if isinstance(r, Delivered):
            delivered.append(e)
        elif not isinstance(r, Rejected):
            raise CheckFailed(f"event {e.id!r} with hostile attributes gave {r!r}; expected Delivered or Rejected")
    if len(delivered) < 3:
        raise CheckFailed(f"only {len(delivered)} of {len(events)} events with printable values were delivered")
    got = by_id(delivered, await s.expect(len(delivered)))
    assert_same(delivered, list(got.values()))
    for rec in got.values():
        forged = [h for h in rec.headers if "injected" in h.lower() or h.lower() in ("set-cookie", "x")]
        if forged:
            raise CheckFailed(f"event {rec.event.id!r} arrived with header(s) {forged}: an attribute value added them")
    await s.expect_nothing_more()


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.texts: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(Exception):
            self.texts.append(record.getMessage())
            if record.exc_info:
                self.texts.append("".join(traceback.format_exception(*record.exc_info)))
            self.texts.append(repr(record.args))


@contextlib.contextmanager
def capture_logs() -> Iterator[_Capture]:
    """Every log record of the process at DEBUG, while the block runs."""
    root = logging.getLogger()
    handler, level = _Capture(), root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(level)


def describe(exc: BaseException) -> str:
    """All a user could see of ``exc``: str, repr, notes, causes, the formatted traceback."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


async def _exercise(ctx: Context, what: str, t: Transport, seen: list[str], *, send: bool) -> None:
    """open/send/check/close on ``t``, recording every result, exception and repr in ``seen``."""
    seen += [repr(t), str(t), repr(t.config), str(t.config)]
    ev = ctx.event("secret", data=b"s")
    try:
        await guarded(f"{what}: open()", t.open(), ctx.timeout)
        if send:
            results = await guarded(f"{what}: send()", t.send([Message(ev, t.target(ev), ev.stream)]), ctx.timeout)
            seen += [repr(r) for r in results] + [str(r) for r in results]
    except OutrelayError as exc:
        seen.append(describe(exc))
    try:
        seen.append(str(await guarded(f"{what}: check()", t.check(), ctx.timeout)))
    except OutrelayError as exc:
        seen.append(describe(exc))
    with contextlib.suppress(OutrelayError):
        await guarded(f"{what}: close()", t.close(), ctx.timeout)


@check
async def secret_never_leaks(ctx: Context) -> None:
    """The secret the transport is configured with never appears in results, exceptions, check() output, reprs
    or log records — also against a broker that is down and with credentials that may not publish."""
    secret = ctx.ct.secret
    if not secret:
        raise ctx.no_hook("secret")
    if len(secret) < 6:
        raise CheckSkipped(f"the declared secret is {len(secret)} characters: too short to grep for reliably")
    seen: list[str] = []
    with capture_logs() as logs:
        s = await ctx.session()
        await _exercise(ctx, "transport", s.transport, seen, send=True)
        target = s.target
        if ctx.ct.make_unreachable is not None:
            await _exercise(ctx, "unreachable", ctx.adopt(ctx.ct.make_unreachable(target)), seen, send=True)
        if ctx.ct.make_forbidden is not None:
            await _exercise(ctx, "forbidden", ctx.adopt(ctx.ct.make_forbidden(target)), seen, send=True)
    forms = {secret, quote(secret, safe=""), quote(secret)}
    for where, texts in (("a result, exception, check() output or repr", seen), ("a log record", logs.texts)):
        for text in texts:
            if any(f in text for f in forms):
                at = next(text.find(f) for f in forms if f in text)
                around = text[max(0, at - 40) : at].replace(secret, "<SECRET>")
                raise CheckFailed(f"the secret appears in {where}, after {around!r}; mask it (pydantic SecretStr)")


def _forbidden(ctx: Context, target: str) -> Transport:
    make = ctx.ct.make_forbidden
    if make is None:
        raise ctx.no_hook("make_forbidden")
    return ctx.adopt_made("make_forbidden", make(target))


@check
async def forbidden_send_permanent(ctx: Context) -> None:
    """With credentials that may not publish, open() or send() fails permanently (Rejected or a non-retryable
    error) within the bound: never Delivered, never retried for ever."""
    target = await ctx.new_target()
    t = _forbidden(ctx, target)
    ev = ctx.event("forbidden", data=b"f")
    try:
        await guarded("open() with forbidden credentials", t.open(), ctx.timeout)
        results = await guarded("send() with forbidden credentials", t.send([Message(ev, t.target(ev), ev.stream)]),
                                ctx.timeout)  # fmt: skip
    except RetryableError as exc:
        raise CheckFailed(
            f"credentials without permission raised RetryableError ({exc}); the relay would retry for ever — "
            "raise PermanentError or return Rejected"
        ) from exc
    except OutrelayError as exc:
        if not str(exc).strip():
            raise CheckFailed(f"{type(exc).__name__} with an empty message; say what to fix") from exc
        return
    [r] = results
    if isinstance(r, Delivered):
        raise CheckFailed("send() with credentials that may not publish was Delivered; make_forbidden is not forbidden")
    if isinstance(r, RetryLater):
        raise CheckFailed(f"send() with forbidden credentials gave {r!r}; the relay would retry for ever (Rejected)")
    if isinstance(r, Rejected) and not r.reason.strip():
        raise CheckFailed("Rejected with an empty reason; say what to fix")


@check
async def forbidden_check_says_what(ctx: Context) -> None:
    """check() with credentials that may not publish raises a TransportError within the bound whose message
    says what to fix (permission, credentials, access...)."""
    target = await ctx.new_target()
    t = _forbidden(ctx, target)
    try:
        summary = await guarded("check() with forbidden credentials", t.check(), ctx.timeout)
    except TransportError as exc:
        text = str(exc).lower()
        if not any(w in text for w in FIX_WORDS):
            raise CheckFailed(
                f"check() said {str(exc)[:160]!r}; it should say what to fix (permission, credentials, access...)"
            ) from exc
        return
    except OutrelayError as exc:
        raise CheckFailed(f"check() raised {type(exc).__name__}: {exc}; expected a TransportError") from exc
    raise CheckFailed(f"check() reported success with credentials that may not publish: {short(summary)}")
