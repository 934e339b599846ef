"""The machinery every conformance check uses: bounded calls, sessions, reading back.

A check is an ``async def check(ctx: Context) -> None`` registered with
:func:`check`; it fails by raising :class:`CheckFailed` (an AssertionError)
and skips by raising :class:`CheckSkipped` with the reason. :func:`run_check`
runs one check in a fresh event loop under an overall time bound and turns
the outcome into pytest's pass/fail/skip.

Every call into the transport goes through :func:`guarded`: it bounds the
call with a timeout (a hang fails the check instead of the run), turns any
exception that is not an :class:`~outrelay.OutrelayError` into a failure
naming the leaked vendor exception, and fails a call that swallowed the
cancellation at its bound. Around every check, a :class:`~._loopwatch.LoopWatch`
catches calls that block the event loop and a :class:`~._census.Census` the
tasks a transport leaves running and the batches it changes; either fails a
check that passed otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import uuid
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from outrelay.conformance._census import Census
from outrelay.conformance._loopwatch import LoopWatch
from outrelay.core.contract.transport import Capabilities, Message, Reader, Received, SendResult, Transport
from outrelay.core.model.envelope import Event
from outrelay.core.model.errors import OutrelayError

if TYPE_CHECKING:
    from outrelay.conformance._target import ConformanceTarget

__all__ = [
    "CHECKS",
    "EVENT_TYPE",
    "Check",
    "CheckFailed",
    "CheckSkipped",
    "Context",
    "check",
    "guarded",
    "run_check",
]

T = TypeVar("T")
EVENT_TYPE = "outrelay.conformance"
SOURCE = "urn:outrelay:conformance"


class CheckFailed(AssertionError):
    """The transport broke its contract; the message says how."""


class CheckSkipped(Exception):
    """The check does not apply (declared capabilities); ``reason`` says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


@dataclasses.dataclass(frozen=True)
class Check:
    """One registered check: ``name`` (the test is ``test_<name>``), a
    one-sentence ``description`` and the coroutine function."""

    name: str
    description: str
    func: Callable[[Context], Awaitable[None]]


CHECKS: dict[str, Check] = {}


def check(func: Callable[[Context], Awaitable[None]]) -> Callable[[Context], Awaitable[None]]:
    """Register ``func`` as the check named after it; its docstring's first
    paragraph is the description shown in reports."""
    first = (func.__doc__ or func.__name__).strip().split("\n\n", 1)[0]
    CHECKS[func.__name__] = Check(func.__name__, " ".join(first.split()), func)
    return func


async def guarded(what: str, aw: Awaitable[T], timeout: float) -> T:
    """Await ``aw`` for at most ``timeout`` seconds.

    :raises OutrelayError: whatever the transport raised, unchanged.
    :raises CheckFailed: on a hang, when anything but an OutrelayError escapes, or when the call was
        cancelled at the bound and returned (or raised an OutrelayError) instead of letting the
        cancellation through.
    """
    cm = asyncio.timeout(timeout)
    try:
        async with cm:
            result = await aw
    except OutrelayError as exc:
        if cm.expired():
            raise _swallowed(what, timeout, f"raised {type(exc).__name__}: {exc}") from exc
        exc.add_note(f"raised by {what}")  # named if the check did not expect it (see run_check)
        raise
    except (CheckFailed, CheckSkipped):
        raise
    except TimeoutError as exc:
        if cm.expired():
            raise CheckFailed(f"{what} did not return within {timeout:g}s; a transport must never hang") from None
        raise _leak(what, exc) from exc
    except Exception as exc:
        raise _leak(what, exc) from exc
    if cm.expired():
        raise _swallowed(what, timeout, f"returned {short(result)}")
    return result


def _swallowed(what: str, timeout: float, instead: str) -> CheckFailed:
    return CheckFailed(
        f"{what} was cancelled at the {timeout:g}s bound and {instead} instead of raising CancelledError; "
        "a transport must let cancellation through (never swallow CancelledError)"
    )


def _leak(what: str, exc: BaseException) -> CheckFailed:
    name = f"{type(exc).__module__}.{type(exc).__qualname__}"
    return CheckFailed(f"{what} raised {name}: {exc} — map vendor exceptions to outrelay errors at one boundary")


def short(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters for failure messages."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 12] + f"...<{len(text)} chars>"


class Context:
    """State of one running check: its unique name, transports and readers
    to clean up, and the ids of the events it made (see ``isolated``)."""

    def __init__(self, target: ConformanceTarget, name: str, tmp_path: Path) -> None:
        self.ct = target
        self.name = name
        self.tmp_path = tmp_path
        self.unique = f"orconf-{name.replace('_', '-')}-{uuid.uuid4().hex[:8]}"
        self.timeout = target.timeout
        self.read_timeout = target.read_timeout
        self.ids: set[str] = set()
        self._transports: list[Transport] = []
        self._readers: list[Reader] = []
        self._cleanups: list[Callable[[], Awaitable[None]]] = []
        self.watch = LoopWatch()
        self.census = Census()

    # -- building blocks -----------------------------------------------------

    def no_hook(self, hook: str, why: str = "") -> CheckSkipped:
        """The skip for a check whose optional ``hook`` the target does not give, with the reason the
        target declares for it (``unsupported``) or ``why``."""
        reason = self.ct.unsupported.get(hook) or why
        return CheckSkipped(f"the target declares no {hook}" + (f": {reason}" if reason else ""))

    def event(self, stream: str = "s", **fields: Any) -> Event:
        """A new event of this check (type :data:`EVENT_TYPE`), tracked by id."""
        fields.setdefault("type", EVENT_TYPE)
        fields.setdefault("source", SOURCE)
        ev = Event(stream=stream, **fields)
        self.ids.add(ev.id)
        return ev

    async def new_target(self, suffix: str = "") -> str:
        """A fresh target name, provisioned when the fixture says how."""
        name = self.unique + (f"-{suffix}" if suffix else "")
        target = name
        if self.ct.provision is not None:
            target = await self.hook(f"provision({name!r})", self.ct.provision(name), max(self.timeout, 30.0))
        cleanup = self.ct.cleanup
        if cleanup is not None:  # removes what the check left on the broker, after its transports closed
            self.on_close(lambda: cleanup(target))
        return target

    async def hook(self, what: str, aw: Awaitable[T], timeout: float) -> T:
        """Await one of the target's own async hooks (``provision``, ``refuse_target``...): bounded like a
        transport call, but the loop watch is paused (the hook is the test fixture's code, not the transport's)."""
        with self.watch.paused():
            return await guarded(what, aw, timeout)

    def transport(self, target: str) -> Transport:
        """``make_transport(target)``, tracked (see :mod:`._census`) and closed when the check ends."""
        with self.watch.paused():  # constructing is the fixture's business
            t = self.ct.make_transport(target)
        if not isinstance(t, Transport):
            raise CheckFailed(f"make_transport returned {type(t).__name__}, not an outrelay.Transport")
        return self.adopt(t)

    def adopt(self, t: Transport) -> Transport:
        """Track ``t`` and close it when the check ends."""
        self.census.track(t)
        self._transports.append(t)
        return t

    def adopt_made(self, hook: str, made: object) -> Transport:
        """Adopt what the target's factory ``hook`` (``make_unreachable``, ``make_forbidden``, ...) returned.

        :raises CheckFailed: it is not an outrelay Transport."""
        if not isinstance(made, Transport):
            raise CheckFailed(f"{hook} returned {type(made).__name__}, not an outrelay.Transport")
        return self.adopt(made)

    def on_close(self, cleanup: Callable[[], Awaitable[None]]) -> None:
        """Await ``cleanup()`` when the check ends, after its transports closed (a fault proxy, a server)."""
        self._cleanups.append(cleanup)

    async def reader(self, t: Transport, target: str) -> Reader:
        """An entered reader of ``target``, stopped when the check ends."""
        try:
            r = t.reader(target)
        except NotImplementedError as exc:
            raise CheckFailed(f"capabilities.reader is true but reader() raised: {exc}") from exc
        return await self.start_reader(r)

    async def start_reader(self, r: Reader) -> Reader:
        """Track and start ``r``; it is stopped when the check ends."""
        self.census.track(r)
        await guarded("reader.start()", r.start(), self.timeout)
        self._readers.append(r)
        return r

    async def session(self, *, need_reader: bool = True, suffix: str = "") -> Session:
        """The common opening: fresh target (``suffix``: a second one of the check), opened transport,
        entered reader (skips without a reader when ``need_reader``)."""
        target = await self.new_target(suffix)
        t = self.transport(target)
        caps = t.capabilities
        if need_reader and not caps.reader:
            raise CheckSkipped("transport declares no reader (capabilities.reader is false)")
        await guarded("open()", t.open(), self.timeout)
        actual = t.target(self.event())
        # a reader whenever there is one: on some brokers (AMQP) it is what makes a target routable
        return Session(self, t, caps, actual, await self.reader(t, actual) if caps.reader else None)

    async def aclose(self) -> None:
        """Stop readers and close transports; errors here are the check's failure."""
        problems: list[str] = []
        for r in reversed(self._readers):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(r.stop(), self.timeout)
        for t in reversed(self._transports):
            try:
                await guarded("close()", t.close(), self.timeout)
            except Exception as exc:
                problems.append(str(exc) if isinstance(exc, CheckFailed) else f"close() raised {exc!r}")
        with self.watch.paused():
            for cleanup in reversed(self._cleanups):
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(cleanup(), self.timeout)
        if problems:
            raise CheckFailed("; ".join(problems))

    def verdict(self) -> None:
        """After a check that passed: fail it for a blocked loop, leaked tasks or a changed batch.

        :raises CheckFailed: with the first such finding."""
        if self.watch.stalls:
            worst = max(self.watch.stalls, key=lambda s: s.seconds)
            raise CheckFailed(
                f"the event loop was blocked {len(self.watch.stalls)} time(s) longer than {self.watch.bound * 1000:.0f}"
                f" ms; the longest: {worst.describe()} — never make blocking calls on the event loop (use the "
                "client's async API, or asyncio.to_thread)"
            )
        if self.census.findings:
            raise CheckFailed(self.census.findings[0].message)
        left = self.census.leftover()
        if left:
            raise CheckFailed(
                f"{len(left)} task(s) of the transport are still running after every transport was closed and "
                f"every reader stopped: {'; '.join(dict.fromkeys(left))}; cancel and await every task you start"
            )


@dataclasses.dataclass
class Session:
    """An opened transport with a reader on its target (see :meth:`Context.session`)."""

    ctx: Context
    transport: Transport
    caps: Capabilities
    target: str
    reader: Reader | None

    def messages(self, events: Iterable[Event]) -> list[Message]:
        """Messages as the relay builds them: rendered target, key = stream."""
        return [Message(e, self.transport.target(e), e.stream) for e in events]

    async def send(self, events: Sequence[Event], *, what: str = "send()") -> list[SendResult]:
        """Send ``events`` as one batch; fails unless one SendResult comes back per message."""
        results = await guarded(what, self.transport.send(self.messages(events)), self.ctx.timeout)
        if not isinstance(results, list | tuple) or len(results) != len(events):
            raise CheckFailed(f"{what} of {len(events)} messages returned {short(results)}, not one result each")
        for r in results:
            if not isinstance(r, SendResult):
                raise CheckFailed(f"{what} returned {short(r)}, not a SendResult")
        return list(results)

    async def read(self, count: int, timeout: float | None = None) -> list[Received]:
        """Up to ``count`` messages of this check within ``timeout`` (default
        ``read_timeout``); on a shared target, foreign messages are ignored."""
        ctx = self.ctx
        reader = self.reader
        if reader is None:
            raise CheckSkipped("transport declares no reader (capabilities.reader is false)")
        limit = ctx.read_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit
        out: list[Received] = []
        while len(out) < count:
            left = deadline - loop.time()
            if left <= 0:
                break
            batch = await guarded("reader.read()", reader.read(count - len(out), left), left + ctx.timeout)
            for r in batch:
                if not isinstance(r, Received):
                    raise CheckFailed(f"reader.read() returned {short(r)}, not a Received")
                if ctx.ct.isolated or r.event.id in ctx.ids:
                    out.append(r)
            if not batch:
                await asyncio.sleep(0.01)  # a reader that returns at once must not spin the loop
        return out

    async def read_until(self, ids: set[str], timeout: float, grace: float = 0.3) -> list[Received]:
        """Read until every id of ``ids`` arrived or ``timeout`` passed, then for ``grace`` more seconds
        (stragglers, duplicates); returns everything read, in arrival order."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        out: list[Received] = []
        missing = set(ids)
        while missing and (left := deadline - loop.time()) > 0:
            batch = await self.read(len(missing), left)
            out += batch
            missing -= {r.event.id for r in batch}
        return out + (await self.read(1000, grace) if grace > 0 else [])

    async def expect(self, count: int) -> list[Received]:
        """Exactly ``count`` messages; fails naming how many arrived."""
        got = await self.read(count)
        if len(got) < count:
            raise CheckFailed(
                f"read back {len(got)} of {count} messages from {self.target!r} within {self.ctx.read_timeout:g}s"
            )
        return got

    async def expect_nothing_more(self) -> None:
        """Fails if any further message of this check arrives within a short grace period."""
        grace = 0.3 if self.caps.ordering_by_key else 1.0
        extra = await self.read(1, grace)
        if extra:
            raise CheckFailed(f"an unexpected extra message arrived: {extra[0].event!r}")


def by_id(sent: Sequence[Event], got: Sequence[Received]) -> dict[str, Received]:
    """Match received messages to sent events by id; fails on strangers and duplicates."""
    want = {e.id for e in sent}
    out: dict[str, Received] = {}
    for r in got:
        if r.event.id not in want:
            raise CheckFailed(f"received event id {r.event.id!r}, which was never sent (sent {sorted(want)[:5]}...)")
        if r.event.id in out:
            raise CheckFailed(f"received event {r.event.id!r} twice")
        out[r.event.id] = r
    return out


def diff_events(sent: Event, got: Event, *, sequence: bool = True) -> list[str]:
    """Field-by-field differences between two events, as readable lines."""
    a, b = sent.attributes(), got.attributes()
    out = [f"{k}: sent {short(a[k])}, received {short(b.get(k))}" for k in a if a[k] != b.get(k)]
    if sent.data != got.data:
        out.append(f"data: sent {short(sent.data)}, received {short(got.data)}")
    if sequence and sent.sequence != got.sequence:
        out.append(f"sequence: sent {sent.sequence!r}, received {got.sequence!r}")
    return out


def assert_same(sent: Sequence[Event], got: Sequence[Received], *, sequence: bool = True) -> dict[str, Received]:
    """Every sent event came back once, identical field by field."""
    matched = by_id(sent, got)
    problems = []
    for e in sent:
        r = matched.get(e.id)
        if r is None:
            problems.append(f"event {e.id!r} was not received")
            continue
        problems += [f"event {e.id!r} {d}" for d in diff_events(e, r.event, sequence=sequence)]
    if problems:
        raise CheckFailed("; ".join(problems[:6]) + (f" (+{len(problems) - 6} more)" if len(problems) > 6 else ""))
    return matched


def check_bound(target: ConformanceTarget) -> float:
    """The overall time bound of one check: generous, but finite."""
    return 2 * target.read_timeout + 6 * target.timeout + 5.0


def run_check(target: Any, name: str, tmp_path: Path, node: Any = None) -> None:
    """Run check ``name`` against ``target`` and report it to pytest."""
    import pytest

    from outrelay.conformance._target import ConformanceTarget

    if not isinstance(target, ConformanceTarget):
        pytest.fail(f"fixture conformance_target returned {type(target).__name__}, not a ConformanceTarget")
    entry = CHECKS[name]
    # the consumer-side checks also wait out claim_timeout: joins, rebalances, a dead member's handover
    bound = check_bound(target) + (4 * target.claim_timeout if name.startswith("subscription_") else 0.0)

    async def main() -> None:
        ctx = Context(target, name, tmp_path)
        ctx.watch.start()
        ctx.census.install()
        try:
            try:
                async with asyncio.timeout(bound):
                    await entry.func(ctx)
            except TimeoutError as exc:
                raise CheckFailed(f"the check did not finish within its bound of {bound:g}s") from exc
            except OutrelayError as exc:  # an error the check did not expect: say who raised it
                where = "; ".join(getattr(exc, "__notes__", ())) or "raised"
                raise CheckFailed(f"{where}: unexpected {type(exc).__name__}: {exc}") from exc
        except BaseException:
            with contextlib.suppress(Exception):  # the first failure is the one to report
                await ctx.aclose()
            raise
        else:
            await ctx.aclose()
            ctx.watch.stop()
            ctx.verdict()
        finally:
            ctx.watch.stop()
            if node is not None and ctx._transports:
                first = ctx._transports[0]
                node.user_properties.append(("outrelay_transport_class", type(first).__name__))
                with contextlib.suppress(Exception):  # a broken capabilities property is another check's failure
                    node.user_properties.append(("outrelay_delivery", str(first.capabilities.delivery)))

    skipped = failed = None
    try:
        asyncio.run(main())
    except CheckSkipped as exc:
        skipped = exc.reason
    except CheckFailed as exc:
        failed = str(exc)
    finally:
        gc.collect(1)  # a leaked socket/file warns now, blamed on the check that leaked it (young gens: cheap)
    # outside the except blocks, so pytest shows the message, not a chain of tracebacks
    if skipped is not None:
        pytest.skip(skipped)
    if failed is not None:
        pytest.fail(failed, pytrace=False)
