"""Task census and call tracking: what a transport leaves behind, and what it does to the batch it is given.

Every transport (and reader) a check makes is *tracked*: its ``open``/``send``/
``close``/``check`` (``start``/``read``/``stop``) are wrapped on the instance so
that, while one runs, a context variable names the call. The check's loop has
a task factory that tags every task created under such a call — by the
transport, by its client library, by a callback it registered — with the call,
the coroutine's name and where it was created. Then:

* after ``close()`` returns (``stop()`` for a reader), the instance's tasks must
  all finish within :data:`GRACE` seconds;
* after ``open()`` or ``check()`` *raises*, the tasks that call created must
  finish within :data:`GRACE` too — the relay retries ``open()`` without
  calling ``close()`` (a failed open must undo itself), and ``check()`` is a
  probe that leaves nothing running;
* ``send()`` must leave the caller's batch as it was: the same list, in the
  same order, holding the same messages with the same events.

Each breach is recorded as a :class:`Finding`; the harness fails the check
with the first one once the check itself has passed.
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import sys
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

from outrelay.core.contract.transport import Message, Reader, Transport
from outrelay.core.model.errors import OutrelayError

__all__ = ["GRACE", "Census", "Finding"]

#: seconds a transport's tasks get to finish after close() (or a failed open()/check()) returned
GRACE = 1.0
_ASYNCIO = str(Path(asyncio.__file__).parent)


@dataclasses.dataclass(frozen=True)
class _Call:
    owner: object
    what: str


@dataclasses.dataclass(frozen=True)
class _Origin:
    call: _Call
    name: str
    where: str


@dataclasses.dataclass(frozen=True)
class Finding:
    """One breach of the in-process contract, as a sentence."""

    message: str


_CALL: contextvars.ContextVar[_Call | None] = contextvars.ContextVar("outrelay_conformance_call", default=None)


def _created_at() -> str:
    """``file:line in function`` of the code that created a task (asyncio's own frames skipped)."""
    frame: FrameType | None = sys._getframe(2)
    for _ in range(12):
        if frame is None:
            break
        if not frame.f_code.co_filename.startswith(_ASYNCIO) and frame.f_code.co_filename != __file__:
            return f"{Path(frame.f_code.co_filename).name}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "?"


def _fingerprint(m: Message) -> tuple[Any, ...]:
    e = m.event
    return (m.target, m.key, m.attempt, id(e), e.id, e.stream, e.type, e.data, tuple(e.metadata.items()))


class Census:
    """Tags tasks with the tracked call that created them; see the module docstring."""

    def __init__(self) -> None:
        self.findings: list[Finding] = []
        self._tasks: dict[asyncio.Task[Any], _Origin] = {}
        self._base: Any = None

    def install(self) -> None:
        """Set the task factory of the running loop (call from inside it)."""
        loop = asyncio.get_running_loop()
        self._base = loop.get_task_factory()
        loop.set_task_factory(self._factory)  # type: ignore[arg-type]  # typeshed's factory type is narrower

    def _factory(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any], **kw: Any) -> Any:
        task = asyncio.Task(coro, loop=loop, **kw) if self._base is None else self._base(loop, coro, **kw)
        call = _CALL.get()
        if call is not None and not task.done():
            name = getattr(coro, "__qualname__", type(coro).__name__)
            self._tasks[task] = _Origin(call, name, _created_at())
            task.add_done_callback(self._forget)
        return task

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.pop(task, None)

    # -- tracking ----------------------------------------------------------------

    def track(self, obj: Transport | Reader) -> None:
        """Wrap ``obj``'s lifecycle methods on the instance (a transport or a reader)."""
        if getattr(obj, "_outrelay_conformance_tracked", False):
            return
        if isinstance(obj, Transport):
            names: Sequence[str] = ("open", "send", "close", "check")
        else:
            names = ("start", "read", "stop")
        for name in names:
            method = getattr(obj, name, None)
            if method is not None:
                wrapper = self._send_wrapper(obj, method) if name == "send" else self._wrapper(obj, name, method)
                object.__setattr__(obj, name, wrapper)
        object.__setattr__(obj, "_outrelay_conformance_tracked", True)

    def _wrapper(self, obj: object, name: str, method: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        census = self

        async def tracked(*args: Any, **kwargs: Any) -> Any:
            call = _Call(obj, f"{name}()")
            token = _CALL.set(call)
            try:
                result = await method(*args, **kwargs)
            except OutrelayError:
                if name in ("open", "check"):
                    await census._settle(call, lambda o: o.call is call, f"{call.what} failed and")
                raise
            finally:
                _CALL.reset(token)
            if name in ("close", "stop"):
                await census._settle(call, lambda o: o.call.owner is obj, f"{call.what} returned but")
            return result

        return tracked

    def _send_wrapper(self, obj: object, method: Callable[..., Awaitable[Any]]) -> Callable[..., Any]:
        census = self

        async def tracked_send(batch: Sequence[Message], *args: Any, **kwargs: Any) -> Any:
            before, prints = list(batch), [_fingerprint(m) for m in batch]
            token = _CALL.set(_Call(obj, "send()"))
            try:
                return await method(batch, *args, **kwargs)
            finally:
                _CALL.reset(token)
                census._compare(batch, before, prints)

        return tracked_send

    # -- verdicts --------------------------------------------------------------------

    def _compare(self, batch: Sequence[Message], before: list[Message], prints: list[tuple[Any, ...]]) -> None:
        after = list(batch)
        if len(after) != len(before) or any(a is not b for a, b in zip(after, before, strict=True)):
            order = "reordered" if sorted(map(id, after)) == sorted(map(id, before)) else "changed"
            message = (
                f"send() {order} the caller's batch list in place ({len(before)} messages before, {len(after)} "
                "after); never change the batch you are given: copy it if you need another order"
            )
            self.findings.append(Finding(message))
            return
        for i, (m, fp) in enumerate(zip(after, prints, strict=True)):
            if _fingerprint(m) != fp:
                message = (
                    f"send() changed message #{i} of the caller's batch (event {m.event.id!r}: its target, key, "
                    "attempt, event or metadata); messages and events are the caller's, never the transport's"
                )
                self.findings.append(Finding(message))
                return

    async def _settle(self, call: _Call, mine: Callable[[_Origin], bool], what: str) -> None:
        """Give the tasks ``mine`` selects :data:`GRACE` seconds to finish; record those still running."""
        tasks = [t for t, o in self._tasks.items() if mine(o) and t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks, timeout=GRACE)
        left = [(t, self._tasks[t]) for t in tasks if not t.done() and t in self._tasks]
        if not left:
            return
        kinds: dict[str, int] = {}
        for _, o in left:
            key = f"{o.name} (started in {o.call.what} at {o.where})"
            kinds[key] = kinds.get(key, 0) + 1
        listed = "; ".join(f"{k} x{n}" if n > 1 else k for k, n in kinds.items())
        owner = "reader" if isinstance(call.owner, Reader) else "transport"
        message = (
            f"{what} {len(left)} task(s) of the {owner} were still running {GRACE:g}s later: {listed}; "
            "cancel and await every task you start"
        )
        self.findings.append(Finding(message))
        for t, _ in left:  # reported once: do not blame the next call for them
            self._tasks.pop(t, None)

    def leftover(self) -> list[str]:
        """Tasks of tracked objects still running now (the end of a check, after every close)."""
        return [f"{o.name} (started in {o.call.what} at {o.where})" for t, o in self._tasks.items() if not t.done()]
